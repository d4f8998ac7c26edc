// DocsParser: how the documents' shell blocks and docs-test markers are read
// (doc_blocks.h).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "doc_blocks.h"

namespace docs::parser_test {

TEST(DocsParser, FindsShellBlocksOnly) {
  const Parsed p = ParseMarkdown("t.md",
                                 "# T\n"
                                 "```sh\necho one\n```\n"
                                 "```\nuntagged\n```\n"
                                 "```yaml\nk: v\n```\n"
                                 "```text\nt\n```\n"
                                 "```json\n{}\n```\n"
                                 "```bash\necho two\n```\n"
                                 "~~~shell\necho three\n~~~\n"
                                 "````Bash {.x}\n```\necho four\n````\n"
                                 "  ```sh\n  echo five\n   indented\n  ```\n");
  EXPECT_TRUE(p.problems.empty());
  ASSERT_EQ(p.blocks.size(), 5u);
  EXPECT_EQ(p.blocks[0].line, 2);
  EXPECT_EQ(p.blocks[0].script, "echo one\n");
  EXPECT_EQ(p.blocks[1].info, "bash");
  EXPECT_EQ(p.blocks[1].line, 17);
  EXPECT_EQ(p.blocks[2].script, "echo three\n");
  EXPECT_EQ(p.blocks[3].info, "bash");
  EXPECT_EQ(p.blocks[3].script, "```\necho four\n");
  EXPECT_EQ(p.blocks[4].script, "echo five\n indented\n");
  for (const Block& b : p.blocks) EXPECT_FALSE(b.marked);
}

TEST(DocsParser, ConsoleRunsTheCommandsOnly) {
  const Parsed p = ParseMarkdown("t.md", "```console\n$ echo a \\\n    b\na b\n$ true\n```\n");
  ASSERT_EQ(p.blocks.size(), 1u);
  EXPECT_EQ(p.blocks[0].script, "echo a \\\n    b\n\ntrue\n");
}

TEST(DocsParser, MarkerSkipsTheNextShellBlock) {
  const Parsed p = ParseMarkdown("t.md",
                                 "<!-- docs-test: skip: needs GPUs -->\n\n\n"
                                 "```sh\nnvidia-smi\n```\n"
                                 "```sh\ntrue\n```\n");
  EXPECT_TRUE(p.problems.empty());
  ASSERT_EQ(p.blocks.size(), 2u);
  EXPECT_TRUE(p.blocks[0].marked);
  EXPECT_EQ(p.blocks[0].reason, "needs GPUs");
  EXPECT_EQ(p.blocks[0].marker_line, 1);
  EXPECT_FALSE(p.blocks[1].marked);
}

TEST(DocsParser, MarkerWithoutReasonIsAProblem) {
  const Parsed p = ParseMarkdown("t.md", "<!-- docs-test: skip:   -->\n```sh\ntrue\n```\n");
  ASSERT_EQ(p.problems.size(), 1u);
  EXPECT_EQ(p.problems[0].line, 1);
  EXPECT_NE(p.problems[0].message.find("no reason"), std::string::npos);
  ASSERT_EQ(p.blocks.size(), 1u);
  EXPECT_TRUE(p.blocks[0].marked);
  EXPECT_EQ(p.blocks[0].reason, "");
}

TEST(DocsParser, MarkerBeforeNoShellBlockIsAProblem) {
  const std::vector<std::string> docs = {
      "<!-- docs-test: skip: x -->\nsome text\n```sh\ntrue\n```\n",
      "<!-- docs-test: skip: x -->\n```yaml\nk: v\n```\n",
      "<!-- docs-test: skip: x -->\n```\nuntagged\n```\n",
      "<!-- docs-test: skip: x -->\n<!-- docs-test: skip: y -->\n```sh\ntrue\n```\n",
      "text\n\n<!-- docs-test: skip: x -->\n",
  };
  for (const std::string& d : docs) {
    const Parsed p = ParseMarkdown("t.md", d);
    ASSERT_EQ(p.problems.size(), 1u) << d;
    EXPECT_EQ(p.problems[0].line, d.rfind("text", 0) == 0 ? 3 : 1) << d;
    EXPECT_NE(p.problems[0].message.find("precedes no shell block"), std::string::npos) << d;
  }
  // The shell block after the text is not skipped.
  const Parsed p = ParseMarkdown("t.md", docs[0]);
  ASSERT_EQ(p.blocks.size(), 1u);
  EXPECT_FALSE(p.blocks[0].marked);
}

TEST(DocsParser, OtherMistakesAreProblems) {
  EXPECT_EQ(ParseMarkdown("t.md", "<!-- docs-test: skipp: x -->\n```sh\ntrue\n```\n").problems.size(), 1u);
  EXPECT_EQ(ParseMarkdown("t.md", "<!-- docs-test skip x -->\n").problems.size(), 1u);
  EXPECT_EQ(ParseMarkdown("t.md", "```sh\ntrue\n").problems.size(), 1u);  // never closed
  // A marker inside a block, or quoted in prose, is no marker.
  EXPECT_TRUE(ParseMarkdown("t.md", "```markdown\n<!-- docs-test: skip: -->\n```\n").problems.empty());
  EXPECT_TRUE(ParseMarkdown("t.md", "Write `<!-- docs-test: skip: REASON -->` above it.\n").problems.empty());
}

}  // namespace docs::parser_test
