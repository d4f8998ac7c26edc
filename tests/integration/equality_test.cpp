// The pipeline equals the single-process reference: every model, stage count,
// micro-batch count and schedule, 20 steps, in-process over the in-memory
// transport, per-step losses and final parameters within rtol 1e-5/atol 1e-6.
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <map>
#include <tuple>

#include "plan/job_spec.h"
#include "tests/support/in_process.h"
#include "tests/support/test_util.h"

namespace conveyor {
namespace {

using testing::ExpectMatchesReference;
using testing::InProcessCluster;
using testing::Reference;
using testing::RunToEnd;

// The reference depends on model, data, optimizer and seed only.
const std::map<std::string, std::string> kModels = {
    {"toy",
     "model: toy\ndata: {name: synthetic, train_samples: 320}\nbatch_size: 16\n"
     "optimizer: {name: sgd, lr: 0.05, momentum: 0.9}\nloss: mse\nsteps: 20\nseed: 3\n"},
    {"gpt",
     "model: {name: gpt, vocab: 40, width: 16, blocks: 4, heads: 2, seq_len: 6}\n"
     "data: {name: synthetic, train_samples: 160}\nbatch_size: 8\n"
     // SGD: Adam turns the zero gradient of the key biases (softmax ignores
     // them) into full-size steps driven by rounding noise.
     "optimizer: {name: sgd, lr: 0.05, momentum: 0.9}\nsteps: 20\nseed: 7\n"},
    // SGD for the matrix: Adam divides each gradient by its own running size,
    // so elements whose gradient is rounding noise (as some are, with
    // LibTorch 2.x's convolutions) take full-size steps that differ between any
    // two summation orders. Adam is covered on Fashion-MNIST below.
    {"convnet",
     "model: convnet\ndata: {name: synthetic, train_samples: 320}\nbatch_size: 16\n"
     "optimizer: {name: sgd, lr: 0.05, momentum: 0.9}\nsteps: 20\nseed: 5\n"},
};

const cli::ReferenceResult& CachedReference(const std::string& model) {
  static std::map<std::string, cli::ReferenceResult> cache;
  auto it = cache.find(model);
  if (it == cache.end()) it = cache.emplace(model, Reference(kModels.at(model))).first;
  return it->second;
}

using Case = std::tuple<std::string, int, int, std::string>;  // model, stages, micro-batches, schedule

class EqualityTest : public ::testing::TestWithParam<Case> {
 protected:
  static void SetUpTestSuite() { at::set_num_threads(1); }
};

TEST_P(EqualityTest, PipelineEqualsReference) {
  const auto& [model, stages, mbs, schedule] = GetParam();
  std::string yaml = kModels.at(model) + "partition: {stages: " + std::to_string(stages) +
                     "}\nmicro_batches: " + std::to_string(mbs) + "\nschedule: " + schedule + "\n";
  if (schedule == "interleaved") yaml += "virtual_stages: 2\n";
  InProcessCluster cluster(stages);
  auto coordinator = cluster.StartCoordinator();
  v1::JobStatus run = RunToEnd(*coordinator, yaml);
  ExpectMatchesReference(run, cluster.Parameters(run.job_id(), stages), CachedReference(model));
  // Activation memory: GPipe holds every micro-batch, 1F1B at most P - s,
  // ZB-H1 keeps some longer for their deferred weight passes.
  for (int s = 0; s < run.stages_size(); ++s) {
    int64_t bound = mbs;
    if (schedule == "1f1b") bound = std::min(mbs, stages - s);
    if (schedule == "zero-bubble") bound = std::min(mbs, 2 * (stages - s) - 1);
    if (schedule == "interleaved") continue;
    EXPECT_EQ(run.stages(s).peak_activations(), bound) << "stage " << s;
  }
}

std::string Name(const ::testing::TestParamInfo<Case>& info) {
  const auto& [model, stages, mbs, schedule] = info.param;
  std::string name = schedule == "1f1b" ? "1F1B" : schedule == "zero-bubble" ? "ZeroBubble" :
                     schedule == "interleaved" ? "Interleaved" : "GPipe";
  return model + "_" + std::to_string(stages) + "stages_" + std::to_string(mbs) + "mb_" + name;
}

INSTANTIATE_TEST_SUITE_P(Toy, EqualityTest,
                         ::testing::Combine(::testing::Values("toy"), ::testing::Values(1, 2, 3),
                                            ::testing::Values(1, 4, 8),
                                            ::testing::Values("gpipe", "1f1b", "zero-bubble")),
                         Name);
INSTANTIATE_TEST_SUITE_P(ConvNet, EqualityTest,
                         ::testing::Combine(::testing::Values("convnet"), ::testing::Values(1, 2, 4),
                                            ::testing::Values(1, 4, 8),
                                            ::testing::Values("gpipe", "1f1b", "zero-bubble")),
                         Name);
// The GPT decoder (7 layers here) with the schedules a 1.34 B model would use.
INSTANTIATE_TEST_SUITE_P(Gpt, EqualityTest,
                         ::testing::Combine(::testing::Values("gpt"), ::testing::Values(1, 2, 3),
                                            ::testing::Values(1, 4), ::testing::Values("1f1b", "zero-bubble")),
                         Name);
INSTANTIATE_TEST_SUITE_P(GptInterleaved, EqualityTest,
                         ::testing::Combine(::testing::Values("gpt"), ::testing::Values(2),
                                            ::testing::Values(4), ::testing::Values("interleaved")),
                         Name);
// Interleaved: two chunks per stage, micro-batches a multiple of the stages.
INSTANTIATE_TEST_SUITE_P(ConvNetInterleaved, EqualityTest,
                         ::testing::Combine(::testing::Values("convnet"), ::testing::Values(1, 2, 4),
                                            ::testing::Values(4, 8), ::testing::Values("interleaved")),
                         Name);

// A job given in epochs reports each: its mean training loss (of the losses
// it reported per step), its time and, evaluated after it, its test accuracy,
// as the reference does; the last epoch's accuracy is the job's.
TEST(Equality, EachEpochIsReportedAndEvaluatedAsByTheReference) {
  at::set_num_threads(1);
  const std::string yaml =
      "model: convnet\ndata: {name: synthetic, train_samples: 64, test_samples: 48}\nbatch_size: 16\n"
      "eval_batch_size: 32\noptimizer: {name: sgd, lr: 0.05, momentum: 0.9}\nepochs: 3\neval: true\nseed: 5\n"
      "partition: {stages: 2}\nmicro_batches: 2\nschedule: 1f1b\n";
  InProcessCluster cluster(2);
  auto coordinator = cluster.StartCoordinator();
  v1::JobStatus run = RunToEnd(*coordinator, yaml);
  ASSERT_EQ(run.state(), v1::JOB_STATE_SUCCEEDED) << run.error();
  const cli::ReferenceResult ref = Reference(yaml);
  ASSERT_EQ(run.epochs_size(), 3);
  ASSERT_EQ(ref.status.epochs_size(), 3);
  ASSERT_EQ(run.losses_size(), 12);
  for (int i = 0; i < 3; ++i) {
    const v1::EpochReport& e = run.epochs(i);
    EXPECT_EQ(e.epoch(), i + 1);
    double sum = 0;
    for (int s = 4 * i; s < 4 * i + 4; ++s) sum += run.losses(s);
    EXPECT_FLOAT_EQ(e.mean_loss(), static_cast<float>(sum / 4));
    EXPECT_NEAR(e.mean_loss(), ref.status.epochs(i).mean_loss(), 1e-4);
    EXPECT_GT(e.train_seconds(), 0);
    ASSERT_TRUE(e.has_eval());
    EXPECT_DOUBLE_EQ(e.eval_accuracy(), ref.status.epochs(i).eval_accuracy()) << "epoch " << i + 1;
  }
  EXPECT_DOUBLE_EQ(run.eval_accuracy(), run.epochs(2).eval_accuracy());
  ExpectMatchesReference(run, cluster.Parameters(run.job_id(), 2), ref);
}

// BatchNorm normalises over whatever batch it sees, so ResNet50 equals the
// full-batch reference with one micro-batch per step (the pipeline of the
// seed's naive model parallel).
TEST(Equality, ResNet50OnTheSeedsTwoStageCut) {
  at::set_num_threads(1);
  const std::string yaml =
      "model: {name: resnet50, image_size: 32, num_classes: 10}\ndata: {name: synthetic, train_samples: 8}\n"
      "batch_size: 4\nsteps: 2\noptimizer: {name: sgd, lr: 0.001}\nloss: mse\npartition: {stages: 2}\n";
  InProcessCluster cluster(2);
  auto coordinator = cluster.StartCoordinator();
  v1::JobStatus run = RunToEnd(*coordinator, yaml);
  ExpectMatchesReference(run, cluster.Parameters(run.job_id(), 2), Reference(yaml));
  EXPECT_EQ(run.stages(1).layer_begin(), 11);
}

TEST(Equality, Bf16TrainsCloseToTheBf16Reference) {
  at::set_num_threads(1);
  const std::string base = kModels.at("gpt") + "precision: bf16\n";
  InProcessCluster cluster(2);
  auto coordinator = cluster.StartCoordinator();
  v1::JobStatus run = RunToEnd(*coordinator, base + "partition: {stages: 2}\nmicro_batches: 2\nschedule: 1f1b\n");
  ASSERT_EQ(run.state(), v1::JOB_STATE_SUCCEEDED) << run.error();
  cli::ReferenceResult ref = Reference(base);
  ASSERT_EQ(run.losses_size(), ref.status.losses_size());
  // bf16 keeps 8 bits of mantissa: the same training, not the same bits.
  for (int i = 0; i < run.losses_size(); ++i) EXPECT_NEAR(run.losses(i), ref.status.losses(i), 0.05) << i;
  EXPECT_LT(run.losses(run.losses_size() - 1), run.losses(0));
}

TEST(Equality, BalancedPartitions) {
  at::set_num_threads(1);
  // By parameters: fc1 (16x4x4 -> 120) holds 69% of the ConvNet's 44,426, so
  // the best two-way cut puts it last on stage 0: layers [0, 8) | [8, 12).
  InProcessCluster cluster(2);
  auto coordinator = cluster.StartCoordinator();
  const std::string base = kModels.at("convnet") + "micro_batches: 4\n";
  v1::JobStatus run = RunToEnd(*coordinator, base + "partition: {stages: 2, balance: params}\n");
  ExpectMatchesReference(run, cluster.Parameters(run.job_id(), 2), CachedReference("convnet"));
  EXPECT_EQ(run.stages(1).layer_begin(), 8);
  // By measured time: a valid cut, whatever the clock said, and the same result.
  run = RunToEnd(*coordinator, base + "partition: {stages: 2, balance: time}\n");
  ExpectMatchesReference(run, cluster.Parameters(run.job_id(), 2), CachedReference("convnet"));
  EXPECT_GT(run.stages(1).layer_begin(), 0);
}

// cuda_graphs is a GPU setting: CPU stages run as they are, nothing recorded.
TEST(Equality, CudaGraphsAreIgnoredOnTheCpu) {
  at::set_num_threads(1);
  InProcessCluster cluster(2);
  auto coordinator = cluster.StartCoordinator();
  v1::JobStatus run = RunToEnd(*coordinator, kModels.at("convnet") + "partition: {stages: 2}\nmicro_batches: 4\n"
                                                                     "schedule: 1f1b\ncuda_graphs: true\n");
  ExpectMatchesReference(run, cluster.Parameters(run.job_id(), 2), CachedReference("convnet"));
  for (const auto& stage : run.stages()) EXPECT_EQ(stage.graphed_steps(), 0) << stage.index();
}

TEST(Equality, RecomputationGivesTheSameResultWithLessMemory) {
  at::set_num_threads(1);
  const std::string base = kModels.at("convnet") + "partition: {stages: 4}\nmicro_batches: 8\nschedule: gpipe\n";
  std::vector<v1::JobStatus> runs;
  for (const char* extra : {"", "recompute: true\n", "recompute: [0, 2]\n"}) {
    InProcessCluster cluster(4);
    auto coordinator = cluster.StartCoordinator();
    runs.push_back(RunToEnd(*coordinator, base + extra));
    ExpectMatchesReference(runs.back(), cluster.Parameters(runs.back().job_id(), 4), CachedReference("convnet"));
  }
  for (int s = 0; s < 4; ++s) {
    EXPECT_LT(runs[1].stages(s).peak_activation_bytes(), runs[0].stages(s).peak_activation_bytes()) << s;
    bool recomputes = s == 0 || s == 2;
    EXPECT_EQ(runs[2].stages(s).peak_activation_bytes() < runs[0].stages(s).peak_activation_bytes(), recomputes) << s;
  }
}

TEST(Equality, UnevenMicroBatchesFromSplitSize) {
  at::set_num_threads(1);
  // The seed's knob: 20 samples in micro-batches of 8, 8 and 4.
  const std::string base =
      "model: convnet\ndata: {name: synthetic, train_samples: 200}\nbatch_size: 20\nsteps: 20\n"
      "optimizer: {name: sgd, lr: 0.1}\n";
  InProcessCluster cluster(3);
  auto coordinator = cluster.StartCoordinator();
  v1::JobStatus run = RunToEnd(*coordinator, base + "partition: {boundaries: [2, 8]}\nsplit_size: 8\nschedule: 1f1b\n");
  EXPECT_EQ(run.micro_batches(), 3);
  ExpectMatchesReference(run, cluster.Parameters(run.job_id(), 3), Reference(base));
}

TEST(Equality, FashionMnistWithEvaluation) {
  if (!testing::HaveFashionMnist()) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  at::set_num_threads(1);
  const std::string base = "model: convnet\ndata: fashion-mnist\nbatch_size: 64\nsteps: 20\neval: true\n"
                           "eval_batch_size: 2500\noptimizer: {name: adam, lr: 0.001}\n";
  InProcessCluster cluster(4);
  auto coordinator = cluster.StartCoordinator();
  v1::JobStatus run = RunToEnd(*coordinator, base + "partition: {stages: 4}\nmicro_batches: 8\n");
  cli::ReferenceResult ref = Reference(base);
  ExpectMatchesReference(run, cluster.Parameters(run.job_id(), 4), ref);
  ASSERT_TRUE(run.has_eval());
  EXPECT_NEAR(run.eval_accuracy(), ref.status.eval_accuracy(), 1.0 / 10000);
  EXPECT_GT(run.eval_accuracy(), 0.3);  // 20 steps already learn something
}

}  // namespace
}  // namespace conveyor
