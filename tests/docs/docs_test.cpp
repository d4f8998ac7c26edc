// The docs are tested (issue 15). Every fenced shell block (sh, bash, shell,
// console) of README.md, docs/*.md and deploy/README.md is one test case: it
// runs on loopback, or is skipped because a marker right above it says why:
//
//   <!-- docs-test: skip: needs GPUs -->
//
// (only blank lines between the marker and the block's fence). A marker with
// no reason, or one that precedes no shell block, fails DocsFiles.MarkersAndFences.
//
// How a block runs (RunBlock, block_runner.h): bash with `set -euo pipefail`, stdin from
// /dev/null, in a fresh folder whose entries are symbolic links to every
// top-level entry of the source tree plus `build` -> the build folder, so that
// `B=build/bin; $B/stage_server ...` and `examples/toy.yaml` work whatever the
// build folder is called; HOME is that folder, build/bin comes first on PATH
// and no CONVEYOR_* variable is passed on. Where it may (root, or an
// unprivileged user namespace), it runs in a private network namespace with
// loopback up and a private /tmp, so the fixed ports the docs use
// (127.0.0.1:50050) and paths like /tmp/conveyor collide with nothing and start
// empty; where it may not, it runs without and says so. Each block is its own
// session and process group; when it ends (or after its timeout, 300 s,
// CONVEYOR_DOCS_TEST_TIMEOUT), whatever it left running is stopped: SIGTERM to
// the group and to every orphan (this process is a child subreaper, so they
// come back to it), SIGKILL after a grace period, and all of them reaped. Waits
// are on events (poll on the output pipe and a signalfd), never sleeps.
//
// Overrides, for the self-tests and for trying a document out:
//   CONVEYOR_DOCS_TEST_FILES=a.md:b.md  the documents to test (default: above)
//   CONVEYOR_DOCS_TEST_TIMEOUT=SECONDS   per block (default 300)
//   CONVEYOR_DOCS_TEST_ISOLATION=none    run without namespaces
//
// DocsTree.NoWorkPeriodNumbers also reads every file git tracks (tests/fixtures
// apart) and fails, naming file and line, where a work period is counted as a
// unit of the project's history: the word "session" and a number, or an
// ordinal or a pointing word ("this", "last", ...) before it.
//
// The blocks are read by doc_blocks.h and run by block_runner.h; the parser,
// the runner and the tree rule have their tests beside this file
// (docs_parser_test.cpp, docs_runner_test.cpp, docs_tree_test.cpp).
//
// Torch-free and linked against GoogleTest only.
#include <gtest/gtest.h>

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "block_runner.h"
#include "doc_blocks.h"

namespace docs::blocks_test {

namespace fs = std::filesystem;

std::vector<Block> AllBlocks() { return Docs().blocks; }

std::string TestName(const ::testing::TestParamInfo<Block>& info) {
  std::string name = info.param.file + "_" + std::to_string(info.param.line);
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  // Two documents whose names sanitise alike would give one name twice.
  static std::set<std::string> seen;
  std::string unique = name;
  for (int k = 2; !seen.insert(unique).second; ++k) unique = name + "_" + std::to_string(k);
  return unique;
}

// The block with bash's line numbers (line 1 is the line after the fence).
std::string Numbered(const Block& b) {
  std::ostringstream s;
  for (size_t i = 0; i < b.lines.size(); ++i) s << std::setw(4) << i + 1 << " | " << b.lines[i] << "\n";
  return s.str();
}

std::string Describe(const RunResult& r) {
  std::ostringstream s;
  if (r.timed_out) {
    s << "did not finish within its timeout (" << std::fixed << std::setprecision(0) << r.seconds
      << " s; CONVEYOR_DOCS_TEST_TIMEOUT sets it) and was stopped";
  } else {
    s << "exited with " << r.exit_code << " after " << std::fixed << std::setprecision(1) << r.seconds << " s";
  }
  s << "; ran in " << r.isolation;
  if (r.left_running > 0) s << "; stopped " << r.left_running << " process(es) it left running";
  if (r.needed_kill) s << " (SIGKILL: SIGTERM did not end them)";
  if (!r.survivors.empty()) s << "; " << r.survivors.size() << " process(es) survived SIGKILL";
  return s.str();
}

// ---------------------------------------------------------------------------
// The documents' blocks.

class DocsBlock : public ::testing::TestWithParam<Block> {};

TEST_P(DocsBlock, Runs) {
  const Block& b = GetParam();
  const std::string where = b.file + ":" + std::to_string(b.line);
  if (b.marked) {
    if (b.reason.empty()) {
      FAIL() << where << ": the docs-test skip marker at line " << b.marker_line
             << " gives no reason; write <!-- docs-test: skip: WHY -->, or remove it and let the block run";
    }
    GTEST_SKIP() << where << ": " << b.reason;
  }
  const RunResult r = RunBlock(b.script, DefaultOptions(), where);
  std::cout << where << ": " << Describe(r) << "\n";
  EXPECT_TRUE(r.exit_code == 0 && !r.timed_out && r.survivors.empty())
      << where << ": the block " << Describe(r) << "\n--- the block (line 1 is " << b.file << ":" << b.line + 1
      << "; mark it <!-- docs-test: skip: REASON --> only if it cannot run here) ---\n"
      << Numbered(b) << "--- its output ---\n"
      << r.output << (r.output.empty() || r.output.back() == '\n' ? "" : "\n") << "--- end ---";
}

INSTANTIATE_TEST_SUITE_P(Docs, DocsBlock, ::testing::ValuesIn(AllBlocks()), TestName);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(DocsBlock);

TEST(DocsFiles, MarkersAndFences) {
  for (const Problem& p : Docs().problems) ADD_FAILURE() << p.file << ":" << p.line << ": " << p.message;
}

TEST(DocsFiles, HaveShellBlocks) {
  // A parser that found nothing, or a wrong source folder, would pass every block test.
  if (std::getenv("CONVEYOR_DOCS_TEST_FILES")) GTEST_SKIP() << "CONVEYOR_DOCS_TEST_FILES names the documents";
  int readme = 0, docs = 0;
  for (const Block& b : Docs().blocks) (b.file == "README.md" ? readme : docs)++;
  EXPECT_GT(readme, 0) << "no shell block found in " << CONVEYOR_SOURCE_DIR << "/README.md";
  EXPECT_GT(docs, 0) << "no shell block found in docs/ or deploy/README.md";
}

// ---------------------------------------------------------------------------
// The whole test, run on documents of our own: a failing unmarked block, a
// marker without reason and a marker above no shell block each fail it.

struct SelfRun {
  int exit_code = -1;
  std::string output;
};

SelfRun RunSelf(const std::string& markdown) {
  std::string tmpl = (fs::temp_directory_path() / "conveyor-docs-self-XXXXXX").string();
  if (!mkdtemp(tmpl.data())) return {};
  const std::string md = tmpl + "/doc.md";
  std::ofstream(md) << markdown;
  setenv("CONVEYOR_DOCS_TEST_FILES", md.c_str(), 1);
  SelfRun r;
  r.exit_code = RunQuiet({"/proc/self/exe", "--gtest_filter=Docs/DocsBlock.*:DocsFiles.*"}, &r.output);
  unsetenv("CONVEYOR_DOCS_TEST_FILES");
  std::error_code ec;
  fs::remove_all(tmpl, ec);
  return r;
}

TEST(DocsSelfTest, UnmarkedFailingBlockFails) {
  const SelfRun r = RunSelf("# Doc\n\n```sh\necho printed-before\necho \"$DOCS_UNSET\"\necho not-reached >&2\n```\n");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("exited with 1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("   2 | echo \"$DOCS_UNSET\""), std::string::npos) << r.output;  // the block
  // bash's own message names the block and its line.
  EXPECT_NE(r.output.find("doc.md:3: line 2: DOCS_UNSET: unbound variable"), std::string::npos) << r.output;
  const auto out = r.output.find("--- its output ---");
  ASSERT_NE(out, std::string::npos) << r.output;
  EXPECT_NE(r.output.find("printed-before", out), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("not-reached", out), std::string::npos) << r.output;
}

TEST(DocsSelfTest, MarkerWithoutReasonFails) {
  const SelfRun r = RunSelf("<!-- docs-test: skip: -->\n```sh\ntrue\n```\n");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("gives no reason"), std::string::npos) << r.output;
}

TEST(DocsSelfTest, MarkerAboveNoShellBlockFails) {
  const SelfRun r = RunSelf("<!-- docs-test: skip: not a shell block -->\n```yaml\nk: v\n```\n");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("precedes no shell block"), std::string::npos) << r.output;
}

TEST(DocsSelfTest, MarkedAndPassingBlocksPass) {
  const SelfRun r = RunSelf(
      "<!-- docs-test: skip: shows a failure -->\n\n```sh\nfalse\n```\n\n"
      "```bash\nB=build/bin\n[ -d examples ]\nsleep infinity &\n```\n");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("shows a failure"), std::string::npos) << r.output;
  // Run: the second block and MarkersAndFences; skipped: the first block and HaveShellBlocks.
  EXPECT_NE(r.output.find("[  PASSED  ] 2 tests"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[  SKIPPED ] 2 tests"), std::string::npos) << r.output;
}

}  // namespace docs::blocks_test
