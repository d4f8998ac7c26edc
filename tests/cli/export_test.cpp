// `conveyor export` (issue 17): a finished job's weights, fetched by the CLI
// from the stage server processes that still hold them, written on the CLI's
// host, equal what the stages hold, bit for bit.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>

#include "cli/local_cluster.h"
#include "model/state_dict.h"
#include "tests/support/test_util.h"

namespace conveyor {
namespace {

using ::testing::HasSubstr;
using testing::Binary;
using testing::RunCommand;

// The toy zoo model (Linear, ReLU, Linear) cut over two stages.
constexpr const char* kToyJob =
    "name: toy\nmodel: {name: toy}\npartition: {stages: 2}\n"
    "data: {name: synthetic, train_samples: 256, test_samples: 64}\nbatch_size: 32\nmicro_batches: 4\n"
    "schedule: 1f1b\noptimizer: {name: sgd, lr: 0.05, momentum: 0.9}\nloss: mse\nsteps: 6\nseed: 1\n";

class Export : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster_ = testing::StartCluster(2);
    ASSERT_TRUE(cluster_);
    dir_ = testing::MakeTempDir("export");
  }

  testing::CommandResult Conveyor(std::vector<std::string> args) {
    args.insert(args.begin(), {Binary("conveyor"), "--coordinator", cluster_->coordinator_address()});
    return RunCommand(args);
  }

  std::unique_ptr<cli::LocalCluster> cluster_;
  std::string dir_;
};

TEST_F(Export, AFinishedJobsWeightsEqualTheStagesExactly) {
  v1::JobStatus job = testing::SubmitAndWait(cluster_->coordinator_address(), kToyJob);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.error();
  ASSERT_EQ(job.stages_size(), 2);
  const std::string file = dir_ + "/toy.pt";
  auto r = Conveyor({"export", job.job_id(), "--out", file});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("wrote " + file + ": 4 tensors"));

  std::vector<std::string> stages;
  for (const auto& s : job.stages()) stages.push_back(s.address());
  const auto held = testing::ServerParameters(stages, job.job_id());
  auto got = ReadStateDict(file);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), held.size());
  ASSERT_EQ(held.size(), 4u);  // two Linear layers: weight and bias each
  std::map<std::string, at::Tensor> by_name(got->begin(), got->end());
  for (const auto& [name, t] : held) {
    ASSERT_EQ(by_name.count(name), 1u) << name;
    EXPECT_EQ(by_name[name].scalar_type(), t.scalar_type()) << name;
    EXPECT_TRUE(at::equal(by_name[name], t)) << name;
  }

  // PyTorch reads it with weights_only=True, where there is one.
  if (RunCommand({"/usr/bin/python3", "-c", "import torch"}).exit_code == 0) {
    r = RunCommand({"/usr/bin/python3", "-c",
                    "import sys, torch; d = torch.load(sys.argv[1], weights_only=True); "
                    "print(sorted(d), tuple(d['0.weight'].shape))",
                    file});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_THAT(r.out, HasSubstr("['0.bias', '0.weight', '2.bias', '2.weight'] (10, 10)"));
  }

  // Once another job ran, the stages hold that one instead.
  ASSERT_EQ(testing::SubmitAndWait(cluster_->coordinator_address(), kToyJob).state(), v1::JOB_STATE_SUCCEEDED);
  r = Conveyor({"export", job.job_id(), "--out", dir_ + "/gone.pt"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("the stages no longer hold " + job.job_id() +
                               " (another job ran since): use save: in the job file"));
  EXPECT_THAT(r.err, HasSubstr("(FAILED_PRECONDITION)"));
}

TEST_F(Export, AnUnknownJobIsNotFoundAndTorchScriptIsNotYetSupported) {
  auto r = Conveyor({"export", "job-404", "--out", dir_ + "/none.pt"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("job-404"));
  EXPECT_THAT(r.err, HasSubstr("(NOT_FOUND)"));
  r = Conveyor({"export", "job-1", "--out", dir_ + "/model.pt", "--format", "torchscript"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("--format torchscript is not supported yet"));
  EXPECT_THAT(r.err, HasSubstr("(INVALID_ARGUMENT)"));
  r = Conveyor({"export", "job-1"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--out is required"));
  r = RunCommand({Binary("conveyor"), "export", "--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_THAT(r.out, HasSubstr("writes FILE on this host"));
}

}  // namespace
}  // namespace conveyor
