// --set KEY=VALUE on a job file (plan/job_overrides.h): nested keys, the
// one-word shorthand, sections made where missing, values typed and checked
// by the job-key table as in a file, and bad overrides named.
#include "plan/job_overrides.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "plan/job_spec.h"

namespace conveyor {
namespace {

using ::testing::HasSubstr;

const char* kJob =
    "# a comment\nmodel: convnet\ndata: {name: synthetic, train_samples: 64}\nbatch_size: 16\nsteps: 4\n"
    "optimizer: {name: sgd, lr: 0.1}\n";

v1::JobSpec Effective(const std::vector<std::string>& sets) {
  auto yaml = ApplyJobOverrides(kJob, sets);
  EXPECT_TRUE(yaml.ok()) << yaml.status();
  if (!yaml.ok()) return v1::JobSpec();
  auto spec = ParseJobYaml(*yaml);
  EXPECT_TRUE(spec.ok()) << spec.status() << "\n" << *yaml;
  return spec.ok() ? *spec : v1::JobSpec();
}

TEST(JobOverrides, SetNestedAndTopLevelKeysOverTheFilesAndAddMissingOnes) {
  const v1::JobSpec spec =
      Effective({"optimizer.lr=0.01", "batch_size=32", "optimizer.name=adamw", "replicas=2", "partition.stages=1"});
  EXPECT_DOUBLE_EQ(spec.optimizer().lr(), 0.01);
  EXPECT_EQ(spec.optimizer().kind(), v1::OPTIMIZER_ADAMW);
  EXPECT_EQ(spec.batch_size(), 32);
  EXPECT_EQ(spec.replicas(), 2);
  EXPECT_EQ(spec.partition().stages(), 1);
  EXPECT_EQ(spec.steps(), 4);  // what no override touched stays
}

// A quoted value stays a string through --set: `cut_before: "14"` names the
// module "14" (an nn.Sequential's child), not the integer the plain 14 would be.
TEST(JobOverrides, QuotedValuesOfTheFileStayQuoted) {
  auto yaml = ApplyJobOverrides("model: {exported: w2.pt2, cut_before: \"14\"}\nname: \"007\"\nsteps: 4\n",
                                {"steps=66"});
  ASSERT_TRUE(yaml.ok()) << yaml.status();
  auto spec = ParseJobYaml(*yaml);
  ASSERT_TRUE(spec.ok()) << spec.status() << "\n" << *yaml;
  EXPECT_EQ(spec->model().cut_before(), "14");
  EXPECT_EQ(spec->name(), "007");
  EXPECT_EQ(spec->steps(), 66);
}

TEST(JobOverrides, AOneWordSectionBecomesItsNameAndListsAreYaml) {
  auto yaml = ApplyJobOverrides("model: mlp\nsteps: 2\n", {"model.hidden=[8, 4]", "model.input_dim=6"});
  ASSERT_TRUE(yaml.ok()) << yaml.status();
  auto spec = ParseJobYaml(*yaml);
  ASSERT_TRUE(spec.ok()) << spec.status() << "\n" << *yaml;
  EXPECT_EQ(spec->model().kind(), v1::MODEL_MLP);
  EXPECT_THAT(std::vector<int64_t>(spec->model().hidden().begin(), spec->model().hidden().end()),
              ::testing::ElementsAre(8, 4));
  EXPECT_EQ(spec->model().input_dim(), 6);
}

TEST(JobOverrides, ValuesAreCheckedByTheKeyTableAsInAFile) {
  auto yaml = ApplyJobOverrides(kJob, {"batch_size=many"});
  ASSERT_TRUE(yaml.ok()) << yaml.status();  // YAML, so applied; the table refuses it
  auto spec = ParseJobYaml(*yaml);
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("batch_size"));
  yaml = ApplyJobOverrides(kJob, {"schedule=gpipe2"});
  ASSERT_TRUE(yaml.ok());
  EXPECT_FALSE(ParseJobYaml(*yaml).ok());
}

TEST(JobOverrides, BadOverridesAreNamedWithTheNearestKey) {
  auto st = ApplyJobOverrides(kJob, {"optimizer.lrr=0.1"}).status();
  EXPECT_TRUE(absl::IsInvalidArgument(st));
  EXPECT_THAT(std::string(st.message()), HasSubstr("--set 'optimizer.lrr=0.1': unknown key optimizer.lrr"));
  EXPECT_THAT(std::string(st.message()), HasSubstr("did you mean optimizer.lr?"));
  st = ApplyJobOverrides(kJob, {"batch_size"}).status();
  EXPECT_THAT(std::string(st.message()), HasSubstr("expected KEY=VALUE"));
  st = ApplyJobOverrides(kJob, {"batch_size="}).status();
  EXPECT_THAT(std::string(st.message()), HasSubstr("no value after '='"));
  st = ApplyJobOverrides("steps: [1\n", {"steps=2"}).status();
  EXPECT_THAT(std::string(st.message()), HasSubstr("not YAML"));
}

}  // namespace
}  // namespace conveyor
