// The documents' shell blocks and markers (doc_blocks.h).
#include "doc_blocks.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

namespace docs {
namespace {

namespace fs = std::filesystem;

bool IsShellInfo(const std::string& info) {
  return info == "sh" || info == "bash" || info == "shell" || info == "console";
}

// A console block shows commands after a "$ " prompt and their output; only the
// commands run (with their continuation lines after a trailing backslash).
std::string ConsoleCommands(const std::vector<std::string>& lines) {
  std::string out;
  bool continued = false;
  for (const std::string& l : lines) {
    std::string cmd;
    if (continued) {
      cmd = l;
    } else {
      const std::string t = l.substr(std::min(l.find_first_not_of(' '), l.size()));
      if (t.rfind("$ ", 0) == 0) {
        cmd = t.substr(2);
      } else if (t == "$") {
        cmd = "";
      } else {
        out += "\n";  // output: keeps line numbers
        continue;
      }
    }
    continued = !cmd.empty() && cmd.back() == '\\';
    out += cmd + "\n";
  }
  return out;
}

struct Document {
  std::string name;  // shown in test names and messages
  std::string path;  // to read
};

std::vector<Document> Documents() {
  std::vector<Document> docs;
  const fs::path src = CONVEYOR_SOURCE_DIR;
  if (const char* files = std::getenv("CONVEYOR_DOCS_TEST_FILES"); files && *files) {
    std::istringstream in(files);
    for (std::string f; std::getline(in, f, ':');) {
      if (f.empty()) continue;
      const fs::path p = fs::path(f).is_absolute() ? fs::path(f) : src / f;
      docs.push_back({f, p.string()});
    }
    return docs;
  }
  docs.push_back({"README.md", (src / "README.md").string()});
  std::vector<std::string> found;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(src / "docs", ec), end; !ec && it != end; it.increment(ec)) {
    if (it->is_regular_file() && it->path().extension() == ".md") {
      found.push_back(it->path().lexically_relative(src).string());
    }
  }
  std::sort(found.begin(), found.end());
  for (const auto& f : found) docs.push_back({f, (src / f).string()});
  docs.push_back({"deploy/README.md", (src / "deploy/README.md").string()});
  return docs;
}

}  // namespace

void PrintTo(const Block& b, std::ostream* os) { *os << b.file << ":" << b.line << " (" << b.info << ")"; }

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string Trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  const auto e = s.find_last_not_of(" \t\r");
  return s.substr(b, e - b + 1);
}

namespace {

// What ParseMarkdown holds from one line to the next.
struct MarkdownState {
  std::string file;
  Parsed parsed;
  bool have_marker = false;  // a marker waits for its shell block
  int marker_line = 0;
  std::string marker_reason;
  bool in_fence = false;
  char fence_char = 0;
  size_t fence_len = 0, fence_indent = 0;
  Block current;

  void AddProblem(int line, std::string message) { parsed.problems.push_back({file, line, std::move(message)}); }
  void Orphan(const std::string& why) {
    AddProblem(marker_line, "the docs-test marker precedes no shell block (" + why + "); put it right above the " +
                                "```sh block it is for, with only blank lines between");
    have_marker = false;
  }
};

// A line inside a fenced block: the closing fence, or one of its lines.
void FenceLine(MarkdownState& st, const std::string& l) {
  const std::string t = Trim(l);
  const size_t lead = l.find_first_not_of(' ');
  if (lead != std::string::npos && lead <= 3 && t.size() >= st.fence_len &&
      t.find_first_not_of(st.fence_char) == std::string::npos) {
    st.in_fence = false;
    if (IsShellInfo(st.current.info)) {
      std::string script;
      if (st.current.info == "console") {
        script = ConsoleCommands(st.current.lines);
      } else {
        for (const auto& bl : st.current.lines) script += bl + "\n";
      }
      st.current.script = script;
      st.parsed.blocks.push_back(st.current);
    }
    return;
  }
  size_t strip = 0;
  while (strip < st.fence_indent && strip < l.size() && l[strip] == ' ') ++strip;
  st.current.lines.push_back(l.substr(strip));
}

// An opening fence at line n; a waiting marker is its, or an orphan.
void OpenFence(MarkdownState& st, const std::smatch& m, int n) {
  st.in_fence = true;
  st.fence_indent = m[1].length();
  st.fence_char = m[2].str()[0];
  st.fence_len = m[2].length();
  st.current = Block{};
  st.current.file = st.file;
  st.current.line = n;
  std::istringstream info(m[3].str());
  info >> st.current.info;
  st.current.info = Lower(st.current.info);
  if (!st.have_marker) return;
  if (IsShellInfo(st.current.info)) {
    st.current.marked = true;
    st.current.marker_line = st.marker_line;
    st.current.reason = st.marker_reason;
    st.have_marker = false;
  } else {
    st.Orphan("the block at line " + std::to_string(n) + " is " +
              (st.current.info.empty() ? std::string("untagged") : "`" + st.current.info + "`") +
              ", which is not run anyway");
  }
}

// A docs-test marker at line n; m[1] is its directive.
void MarkerLine(MarkdownState& st, const std::smatch& m, int n) {
  static const std::regex kSkip(R"(^\s*skip\s*:(.*)$)");
  if (st.have_marker) st.Orphan("another marker follows at line " + std::to_string(n));
  std::smatch s;
  const std::string directive = m[1].str();
  if (!std::regex_match(directive, s, kSkip)) {
    st.AddProblem(n, "unknown docs-test directive '" + Trim(directive) +
                         "': the only one is <!-- docs-test: skip: REASON -->");
    return;
  }
  st.have_marker = true;
  st.marker_line = n;
  st.marker_reason = Trim(s[1].str());
  if (st.marker_reason.empty()) st.AddProblem(n, "the docs-test skip marker gives no reason: say why the block cannot run");
}

}  // namespace

Parsed ParseMarkdown(const std::string& file, const std::string& text) {
  static const std::regex kFence(R"(^( {0,3})(`{3,}|~{3,})(.*)$)");
  static const std::regex kMarker(R"(^\s*<!--\s*docs-test\s*:(.*?)-->\s*$)");

  MarkdownState st;
  st.file = file;
  std::vector<std::string> lines;
  {
    std::istringstream in(text);
    for (std::string l; std::getline(in, l);) {
      if (!l.empty() && l.back() == '\r') l.pop_back();
      lines.push_back(l);
    }
  }
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& l = lines[i];
    const int n = static_cast<int>(i) + 1;
    std::smatch m;
    if (st.in_fence) {
      FenceLine(st, l);
      continue;
    }
    if (std::regex_match(l, m, kFence) && !(m[2].str()[0] == '`' && m[3].str().find('`') != std::string::npos)) {
      OpenFence(st, m, n);
      continue;
    }
    if (std::regex_match(l, m, kMarker)) {
      MarkerLine(st, m, n);
      continue;
    }
    const std::string t = Trim(l);
    if (t.rfind("<!--", 0) == 0 && t.find("docs-test") != std::string::npos) {
      st.AddProblem(n, "a malformed docs-test marker: write <!-- docs-test: skip: REASON --> on a line of its own");
      continue;
    }
    if (t.empty()) continue;
    if (st.have_marker) st.Orphan("text follows at line " + std::to_string(n));
  }
  if (st.in_fence) st.AddProblem(st.current.line, "this fence is never closed");
  if (st.have_marker) st.Orphan("the file ends");
  return st.parsed;
}

const AllDocs& Docs() {
  static const AllDocs all = [] {
    AllDocs a;
    for (const Document& d : Documents()) {
      a.names.push_back(d.name);
      std::ifstream in(d.path, std::ios::binary);
      if (!in) {
        a.problems.push_back({d.name, 0, "cannot read " + d.path});
        continue;
      }
      std::ostringstream text;
      text << in.rdbuf();
      Parsed p = ParseMarkdown(d.name, text.str());
      a.blocks.insert(a.blocks.end(), p.blocks.begin(), p.blocks.end());
      a.problems.insert(a.problems.end(), p.problems.begin(), p.problems.end());
    }
    return a;
  }();
  return all;
}

}  // namespace docs
