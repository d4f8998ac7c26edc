// The documents' fenced shell blocks and their docs-test markers, for
// docs_test: ParseMarkdown reads one document, Docs() every document the test
// covers (README.md, docs/*.md and deploy/README.md, or those
// CONVEYOR_DOCS_TEST_FILES names). docs_test.cpp says how a block runs.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "tree_paths.h"

namespace docs {

struct Block {
  std::string file;       // as shown: relative to the source tree where it lies there
  int line = 0;           // the opening fence's line, 1-based
  std::string info;       // the info string's first word, lower case
  std::vector<std::string> lines;  // the block's lines, fence indentation removed
  std::string script;     // what runs: the lines (for console, the commands only)
  bool marked = false;    // a docs-test marker precedes it
  int marker_line = 0;
  std::string reason;     // the marker's reason (empty: a failure)
};

// gtest prints parameters in --gtest_list_tests; keep it one short line.
void PrintTo(const Block& b, std::ostream* os);

struct Problem {
  std::string file;
  int line = 0;
  std::string message;
};

struct Parsed {
  std::vector<Block> blocks;  // shell blocks only
  std::vector<Problem> problems;
};

std::string Lower(std::string s);
// Without leading and trailing blanks.
std::string Trim(const std::string& s);

// One document's shell blocks, and its markers' mistakes as problems.
Parsed ParseMarkdown(const std::string& file, const std::string& text);

struct AllDocs {
  std::vector<Block> blocks;
  std::vector<Problem> problems;
  std::vector<std::string> names;
};

// Every document's blocks and problems, read once.
const AllDocs& Docs();

}  // namespace docs
