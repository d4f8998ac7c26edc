// DocsTree: no tracked file counts the project's history in work periods
// ("session" with a number after it, or an ordinal or a pointing word such as
// "this" or "last" before it). Torch-free, GoogleTest only.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "block_runner.h"
#include "doc_blocks.h"
#include "tracked_files.h"

namespace docs::tree_test {

namespace fs = std::filesystem;

// The tree speaks for itself: a figure names its date and its machine or cards,
// the story of a change lives in its commit message, and a comment says why the
// code is as it is. So no tracked file counts the project's history in work
// periods ("session" with a number after it, or an ordinal or a pointing word
// such as "this" or "last" before it), which tell a reader nothing. Only
// tests/fixtures is left out: files kept as the tools that wrote them left them.

struct Mention {
  int line = 0;
  std::string text;  // the line, trimmed and shortened
};

bool IsWordChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

bool IsBlank(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }

// Whether blanks and then a digit follow `end`.
bool NumberAfter(const std::string& lower, size_t end) {
  size_t i = end;
  while (i < lower.size() && IsBlank(lower[i])) ++i;
  return i > end && i < lower.size() && std::isdigit(static_cast<unsigned char>(lower[i]));
}

// The word that ends, after blanks, where `end` is; empty where there is none.
std::string WordBefore(const std::string& lower, size_t end) {
  while (end > 0 && IsBlank(lower[end - 1])) --end;
  size_t begin = end;
  while (begin > 0 && IsWordChar(lower[begin - 1])) --begin;
  return lower.substr(begin, end - begin);
}

// An ordinal ("first" to "twentieth", "nth", or digits and st, nd, rd or th) or
// a word that points from one work period to another ("this", "last", ...).
bool CountsAWorkPeriod(const std::string& word) {
  static const std::set<std::string> kWords = {
      "first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth", "eleventh",
      "twelfth", "thirteenth", "fourteenth", "fifteenth", "sixteenth", "seventeenth", "eighteenth", "nineteenth",
      "twentieth", "nth", "this", "that", "last", "previous", "next", "earlier", "same"};
  static const std::set<std::string> kSuffixes = {"st", "nd", "rd", "th"};
  if (kWords.count(word) > 0) return true;
  const size_t digits = word.find_first_not_of("0123456789");
  return digits != 0 && digits != std::string::npos && kSuffixes.count(word.substr(digits)) > 0;
}

// The line of `at`, trimmed and shortened, and its number.
Mention MentionAt(const std::string& text, size_t at) {
  const size_t newline = text.rfind('\n', at);
  const size_t begin = newline == std::string::npos ? 0 : newline + 1;
  const size_t end = std::min(text.find('\n', at), text.size());
  std::string shown = Trim(text.substr(begin, end - begin));
  if (shown.size() > 160) shown = shown.substr(0, 157) + "...";
  return {1 + static_cast<int>(std::count(text.begin(), text.begin() + static_cast<long>(at), '\n')), shown};
}

// Every "session" or "sessions", as a word in any case, followed by blanks and
// a digit, or as a whole word after blanks and a word CountsAWorkPeriod takes.
std::vector<Mention> WorkPeriodMentions(const std::string& text) {
  static const std::string kWord = "session";
  const std::string lower = Lower(text);
  std::vector<Mention> found;
  for (size_t at = lower.find(kWord); at != std::string::npos; at = lower.find(kWord, at + 1)) {
    if (at > 0 && std::isalnum(static_cast<unsigned char>(lower[at - 1]))) continue;
    size_t end = at + kWord.size();
    if (end < lower.size() && lower[end] == 's') ++end;
    const bool whole = end == lower.size() || !IsWordChar(lower[end]);
    if (NumberAfter(lower, end) || (whole && CountsAWorkPeriod(WordBefore(lower, at)))) {
      found.push_back(MentionAt(text, at));
    }
  }
  return found;
}

int ForEachTrackedText(const std::function<void(const std::string&, const std::string&)>& fn, std::string* why) {
  std::string listing;
  const int rc = RunQuiet({"git", "-C", CONVEYOR_SOURCE_DIR, "ls-files", "-z"}, &listing);
  if (rc != 0) {
    *why = "cannot list the tracked files (`git -C " + std::string(CONVEYOR_SOURCE_DIR) + " ls-files` exited with " +
           std::to_string(rc) + "; a tree outside git, or no git installed): " + listing;
    return -1;
  }
  int files = 0;
  std::istringstream names(listing);
  for (std::string name; std::getline(names, name, '\0');) {
    if (name.empty() || name.rfind("tests/fixtures/", 0) == 0) continue;
    std::ifstream in(fs::path(CONVEYOR_SOURCE_DIR) / name, std::ios::binary);
    if (!in) continue;  // tracked but removed from the work tree
    std::ostringstream text;
    text << in.rdbuf();
    if (text.str().find('\0') != std::string::npos) continue;  // not text
    ++files;
    fn(name, text.str());
  }
  return files;
}

TEST(DocsTree, NoWorkPeriodNumbers) {
  std::string report, why;
  const int files = ForEachTrackedText(
      [&](const std::string& name, const std::string& text) {
        for (const Mention& m : WorkPeriodMentions(text)) {
          report += "  " + name + ":" + std::to_string(m.line) + ": " + m.text + "\n";
        }
      },
      &why);
  if (files < 0) GTEST_SKIP() << why;
  EXPECT_GT(files, 0) << "git listed no text file in " << CONVEYOR_SOURCE_DIR;
  EXPECT_TRUE(report.empty())
      << "tracked files count the project's history in work periods (\"session\" with a number after it, or an "
         "ordinal or a pointing word such as \"this\" or \"last\" before it), which a reader cannot place:\n"
      << report
      << "Name the figure's date and its machine or cards instead (e.g. \"2x H100, 2026-11-27\", with the "
         "bench/RESULTS.md entry of that date), put the story of a change in its commit message, and let a "
         "comment say why the code is as it is now.";
}

// A PyTorch wheel's libtorch.so exports its own copy of std::filesystem's
// folder walks; a binary linked with it calls that copy, which crashed
// `conveyor local` and a GPU test with SIGSEGV (docs/architecture.md). So the
// project's C++ walks folders with common/files.h (RemoveTree, ListDir); only
// the two test programs that link neither LibTorch nor the project's
// libraries (docs_test, timeline_picture_test) walk them with std::filesystem.
TEST(SourceTree, NoStdFilesystemFolderWalks) {
  const std::vector<std::string> banned = {"remove_" "all(", "directory_" "iterator", "recursive_directory_" "iterator"};
  std::string report, why;
  const int files = ForEachTrackedText(
      [&](const std::string& name, const std::string& text) {
        if (!IsCpp(name)) return;
        // docs_test and timeline_picture_test link neither LibTorch nor the project's libraries
        if (name.rfind("tests/docs/", 0) == 0 || name == "tests/cli/timeline_picture_test.cpp") return;
        std::istringstream lines(text);
        int n = 0;
        for (std::string line; std::getline(lines, line);) {
          ++n;
          for (const std::string& b : banned) {
            if (line.find(b) != std::string::npos) report += "  " + name + ":" + std::to_string(n) + ": " + line + "\n";
          }
        }
      },
      &why);
  if (files < 0) GTEST_SKIP() << why;
  EXPECT_TRUE(report.empty()) << "std::filesystem folder walks, which bind to a PyTorch wheel's own copy in "
                                 "libtorch.so and crash there:\n"
                              << report << "Use RemoveTree or ListDir (common/files.h).";
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

TEST(DocsTree, FindsOrdinalsAndPointingWordsBeforeTheWord) {
  const std::string word = "sess" "ion";  // kept apart, so that this file passes the check above
  const auto found = WorkPeriodMentions("Tenth " + word + ": X\n(2026-11-23, ninth " + word + ")\nthis " + word +
                                        "'s 126.8 ms\nin the 8th " + word + "s,\nthe SAME\n" + word + ".\n" +
                                        "a Previous " + word + "; an earlier " + word + "\n");
  ASSERT_EQ(found.size(), 7u);
  EXPECT_EQ(found[0].line, 1);
  EXPECT_EQ(found[1].line, 2);
  EXPECT_EQ(found[2].line, 3);
  EXPECT_EQ(found[3].line, 4);
  EXPECT_EQ(found[4].line, 6);  // the pointing word on the line before
  EXPECT_EQ(found[5].line, 7);
  EXPECT_EQ(found[6].line, 7);
  for (const std::string& text : {"a gRPC " + word + " per link", "its own " + word + " and process group",
                                  "this " + word + "_id", "this " + word + "less run", "first-" + word,
                                  "the 1st" + word, "ninths " + word, "x_this " + word, "one " + word}) {
    EXPECT_TRUE(WorkPeriodMentions(text).empty()) << text;
  }
}

// ---------------------------------------------------------------------------
// The parser.

}  // namespace docs::tree_test
