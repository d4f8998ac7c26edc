// CodeShape: the project's C++ reads as its anchors do (LevelDB's short
// functions, files of one concept): no file over 900 lines, and no function
// over 80 lines but those whose comment says why they are long. Torch-free,
// GoogleTest only.
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "tracked_files.h"

namespace docs::tree_test {
namespace {

constexpr int kMaxFileLines = 900;
constexpr int kMaxFunctionLines = 80;
// The words a long function's comment carries to say why it is long.
constexpr const char* kLongBecause = "Long because";

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// The line with its string and character literals emptied and its `//`
// comment cut, so that braces in them are not counted.
std::string CodeOf(const std::string& line) {
  static const std::regex kLiteral(R"re("(\\.|[^"\\])*"|'(\\.|[^'\\])*')re");
  std::string code = std::regex_replace(line, kLiteral, "\"\"");
  const size_t comment = code.find("//");
  return comment == std::string::npos ? code : code.substr(0, comment);
}

// A function's first line: a definition at the file's level or a class's
// (indented by two), ending in its opening brace.
bool OpensFunction(const std::string& line) {
  static const std::regex kTop(R"re(^\S.*\)\s*(const|override|noexcept|->.*)?\s*\{\s*$)re");
  static const std::regex kMember(R"re(^  \S.*\)\s*(const|override|noexcept)?\s*\{\s*$)re");
  static const std::regex kNotOne(R"re(^\s*(namespace|class|struct|enum|union|extern|if|for|while|switch|return|else|case|do)\b)re");
  return (std::regex_match(line, kTop) || std::regex_match(line, kMember)) && !std::regex_search(line, kNotOne);
}

// The comment block right above line `at`.
std::string CommentAbove(const std::vector<std::string>& lines, size_t at) {
  std::string comment;
  for (size_t i = at; i > 0 && lines[i - 1].find("//") != std::string::npos &&
                      lines[i - 1].find_first_not_of(' ') == lines[i - 1].find("//");
       --i) {
    comment = lines[i - 1] + "\n" + comment;
  }
  return comment;
}

struct LongFunction {
  int line = 0, length = 0;
  std::string head;
};

// Functions of more than kMaxFunctionLines lines whose comment does not say
// why, found by counting braces from each function's first line.
std::vector<LongFunction> UnexplainedLongFunctions(const std::string& text) {
  const std::vector<std::string> lines = Lines(text);
  std::vector<LongFunction> found;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (!OpensFunction(lines[i])) continue;
    int depth = 0;
    size_t j = i;
    for (; j < lines.size(); ++j) {
      const std::string code = CodeOf(lines[j]);
      for (char c : code) depth += c == '{' ? 1 : c == '}' ? -1 : 0;
      if (depth <= 0) break;
    }
    const int length = static_cast<int>(j - i + 1);
    if (length > kMaxFunctionLines && CommentAbove(lines, i).find(kLongBecause) == std::string::npos) {
      found.push_back({static_cast<int>(i + 1), length, lines[i].substr(0, 100)});
    }
    i = j;
  }
  return found;
}

TEST(CodeShape, NoFileOverNineHundredLines) {
  std::string report, why;
  const int files = ForEachTrackedText(
      [&](const std::string& name, const std::string& text) {
        if (!IsCpp(name) && std::filesystem::path(name).extension() != ".py") return;
        const size_t n = Lines(text).size();
        if (n > kMaxFileLines) report += "  " + name + ": " + std::to_string(n) + " lines\n";
      },
      &why);
  if (files < 0) GTEST_SKIP() << why;
  EXPECT_TRUE(report.empty()) << "files over " << kMaxFileLines << " lines:\n"
                              << report << "Cut each by concept into files a newcomer can name.";
}

TEST(CodeShape, NoUnexplainedFunctionOverEightyLines) {
  std::string report, why;
  const int files = ForEachTrackedText(
      [&](const std::string& name, const std::string& text) {
        if (!IsCpp(name)) return;
        for (const LongFunction& f : UnexplainedLongFunctions(text)) {
          report += "  " + name + ":" + std::to_string(f.line) + ": " + std::to_string(f.length) + " lines: " +
                    f.head + "\n";
        }
      },
      &why);
  if (files < 0) GTEST_SKIP() << why;
  EXPECT_TRUE(report.empty()) << "functions over " << kMaxFunctionLines << " lines:\n"
                              << report << "Cut each into functions that fit a screen, or say in its comment why "
                              << "it is long (\"" << kLongBecause << " ...\").";
}

TEST(CodeShape, FindsALongFunctionAndItsReason) {
  std::string body;
  for (int i = 0; i < kMaxFunctionLines; ++i) body += "  x += \"}\";  // {\n";
  const std::string function = "int Long(int x) {\n" + body + "  return x;\n}\n";
  const auto found = UnexplainedLongFunctions("// Adds.\n" + function + "int Short() {\n  return 1;\n}\n");
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].line, 2);
  EXPECT_EQ(found[0].length, kMaxFunctionLines + 3);
  EXPECT_TRUE(UnexplainedLongFunctions("// " + std::string(kLongBecause) + " it is a table.\n" + function).empty());
  EXPECT_TRUE(UnexplainedLongFunctions("namespace a {\n" + body + "}\n").empty());
}

}  // namespace
}  // namespace docs::tree_test
