// DocsTree: no tracked file counts the project's history in work periods
// ("session" and a number). Torch-free, GoogleTest only.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "block_runner.h"
#include "doc_blocks.h"

#ifndef CONVEYOR_SOURCE_DIR
#error "CONVEYOR_SOURCE_DIR must name the source tree"
#endif
#ifndef CONVEYOR_BUILD_DIR
#error "CONVEYOR_BUILD_DIR must name the build folder"
#endif

namespace docs::tree_test {

namespace fs = std::filesystem;

// The tree speaks for itself: a figure names its date and its machine or cards,
// the story of a change lives in its commit message, and a comment says why the
// code is as it is. So no tracked file counts the project's history in work
// periods ("session" and a number), which tell a reader nothing. Only
// tests/fixtures is left out: files kept as the tools that wrote them left them.

struct Mention {
  int line = 0;
  std::string text;  // the line, trimmed and shortened
};

// Every "session" or "sessions", as a word in any case, followed by blanks and
// a digit.
std::vector<Mention> WorkPeriodMentions(const std::string& text) {
  static const std::string kWord = "session";
  const std::string lower = Lower(text);
  auto is = [&](size_t i, int (*pred)(int)) { return i < lower.size() && pred(static_cast<unsigned char>(lower[i])); };
  std::vector<Mention> found;
  for (size_t at = lower.find(kWord); at != std::string::npos; at = lower.find(kWord, at + 1)) {
    if (at > 0 && is(at - 1, std::isalnum)) continue;
    size_t i = at + kWord.size();
    if (i < lower.size() && lower[i] == 's') ++i;
    const size_t word_end = i;
    while (is(i, std::isspace)) ++i;
    if (i == word_end || !is(i, std::isdigit)) continue;
    const size_t begin = text.rfind('\n', at) == std::string::npos ? 0 : text.rfind('\n', at) + 1;
    const size_t end = std::min(text.find('\n', at), text.size());
    std::string shown = Trim(text.substr(begin, end - begin));
    if (shown.size() > 160) shown = shown.substr(0, 157) + "...";
    found.push_back({1 + static_cast<int>(std::count(text.begin(), text.begin() + static_cast<long>(at), '\n')), shown});
  }
  return found;
}

TEST(DocsTree, NoWorkPeriodNumbers) {
  std::string listing;
  const int rc = RunQuiet({"git", "-C", CONVEYOR_SOURCE_DIR, "ls-files", "-z"}, &listing);
  if (rc != 0) {
    GTEST_SKIP() << "cannot list the tracked files (`git -C " << CONVEYOR_SOURCE_DIR << " ls-files` exited with "
                 << rc << "; a tree outside git, or no git installed): " << listing;
  }
  int files = 0;
  std::string report;
  std::istringstream names(listing);
  for (std::string name; std::getline(names, name, '\0');) {
    if (name.empty() || name.rfind("tests/fixtures/", 0) == 0) continue;
    std::ifstream in(fs::path(CONVEYOR_SOURCE_DIR) / name, std::ios::binary);
    if (!in) continue;  // tracked but removed from the work tree
    std::ostringstream text;
    text << in.rdbuf();
    if (text.str().find('\0') != std::string::npos) continue;  // not text
    ++files;
    for (const Mention& m : WorkPeriodMentions(text.str())) {
      report += "  " + name + ":" + std::to_string(m.line) + ": " + m.text + "\n";
    }
  }
  EXPECT_GT(files, 0) << "git listed no text file in " << CONVEYOR_SOURCE_DIR;
  EXPECT_TRUE(report.empty())
      << "tracked files count the project's history in work periods (\"session\" and a number), which a reader "
         "cannot place:\n"
      << report
      << "Name the figure's date and its machine or cards instead (e.g. \"2x H100, 2026-11-27\", with the "
         "bench/RESULTS.md entry of that date), put the story of a change in its commit message, and let a "
         "comment say why the code is as it is now.";
}

TEST(DocsTree, FindsWorkPeriodsInAnyCaseAndNothingElse) {
  const std::string word = "sess" "ion";  // kept apart, so that this file passes the check above
  const std::string upper = "S" + word.substr(1);
  const auto found = WorkPeriodMentions("a\nfigures of " + word + " 27, " + upper + " 17's\n\n" + word +
                                        "s 12 and 13\n" + "SESSION\t3\n" + word + "\n4\n");
  ASSERT_EQ(found.size(), 5u);
  EXPECT_EQ(found[0].line, 2);
  EXPECT_EQ(found[0].text, "figures of " + word + " 27, " + upper + " 17's");
  EXPECT_EQ(found[1].line, 2);
  EXPECT_EQ(found[2].line, 4);
  EXPECT_EQ(found[3].line, 5);
  EXPECT_EQ(found[4].line, 6);  // the number on the next line
  for (const std::string& text : {"its own " + word + " and process group", "pos" + word + " 5",
                                  "bench/results/" + word + "22-2026-11-26/", word + "_id 4", "a " + word + ":"}) {
    EXPECT_TRUE(WorkPeriodMentions(text).empty()) << text;
  }
}

// ---------------------------------------------------------------------------
// The parser.

}  // namespace docs::tree_test
