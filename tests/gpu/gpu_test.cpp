// Stages on CUDA devices. Every test skips where there is no GPU (CI); on the
// GPU machine they run with TF32 off and deterministic cuDNN, against the
// reference on the same device.
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include "cli/local_cluster.h"
#include "common/device.h"
#include "common/net.h"
#include "conveyor.grpc.pb.h"
#include "tests/support/in_process.h"
#include "tests/support/test_util.h"

namespace conveyor {
namespace {

// TF32 off in every NVIDIA library (cuBLAS and cuDNN) before any handle
// exists; LibTorch 2.x's own switches differ from version to version.
const bool kNoTf32 = [] { return setenv("NVIDIA_TF32_OVERRIDE", "0", 1) == 0; }();

class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    gpus_ = CudaDeviceCount();
    if (gpus_ == 0) GTEST_SKIP() << "no CUDA device here";
    at::globalContext().setAllowTF32CuBLAS(false);
    at::globalContext().setAllowTF32CuDNN(false);
    at::globalContext().setDeterministicCuDNN(true);
    at::globalContext().setBenchmarkCuDNN(false);
  }
  std::vector<std::string> Devices(int stages) const {
    std::vector<std::string> d;
    for (int i = 0; i < stages; ++i) d.push_back("cuda:" + std::to_string(i % gpus_));
    return d;
  }
  int gpus_ = 0;
};

const char* kConvNet =
    "model: convnet\ndata: {name: synthetic, train_samples: 256}\nbatch_size: 32\nsteps: 20\n"
    "optimizer: {name: sgd, lr: 0.05, momentum: 0.9}\nseed: 4\neval: true\n";
const char* kGpt =
    "model: {name: gpt, vocab: 64, width: 32, blocks: 4, heads: 4, seq_len: 16}\n"
    "data: {name: synthetic, train_samples: 128}\nbatch_size: 16\nsteps: 20\n"
    "optimizer: {name: sgd, lr: 0.05, momentum: 0.9}\n";

// One micro-batch: every convolution sees the batch the reference's does.
// With 4 micro-batches the parameters drifted ~1e-3 from the reference after
// 20 steps on the H200s (cuDNN chooses its algorithms by batch size); the
// micro-batched arithmetic on GPUs is covered by the GPT test below.
TEST_F(GpuTest, ConvNetOnGpuStagesEqualsTheGpuReference) {
  for (const char* schedule : {"gpipe", "1f1b"}) {
    const std::string yaml = std::string(kConvNet) + "partition: {stages: 2}\nmicro_batches: 1\nschedule: " + schedule + "\n";
    testing::InProcessCluster cluster(2, nullptr, Devices(2));
    auto coordinator = cluster.StartCoordinator();
    v1::JobStatus run = testing::RunToEnd(*coordinator, yaml);
    EXPECT_EQ(run.stages(0).device(), "cuda:0");
    testing::ExpectMatchesReference(run, cluster.Parameters(run.job_id(), 2), testing::Reference(yaml, "cuda:0"));
  }
}

TEST_F(GpuTest, GptOnGpuStagesEqualsTheGpuReference) {
  for (const char* schedule : {"1f1b", "zero-bubble"}) {
    const std::string yaml = std::string(kGpt) + "partition: {stages: 2}\nmicro_batches: 4\nschedule: " + schedule + "\n";
    testing::InProcessCluster cluster(2, nullptr, Devices(2));
    auto coordinator = cluster.StartCoordinator();
    v1::JobStatus run = testing::RunToEnd(*coordinator, yaml);
    testing::ExpectMatchesReference(run, cluster.Parameters(run.job_id(), 2), testing::Reference(yaml, "cuda:0"));
  }
}

TEST_F(GpuTest, Bf16GptTrainsOnGpus) {
  const std::string yaml = std::string(kGpt) + "precision: bf16\npartition: {stages: 2}\nmicro_batches: 4\n";
  testing::InProcessCluster cluster(2, nullptr, Devices(2));
  auto coordinator = cluster.StartCoordinator();
  v1::JobStatus run = testing::RunToEnd(*coordinator, yaml);
  ASSERT_EQ(run.state(), v1::JOB_STATE_SUCCEEDED) << run.error();
  EXPECT_LT(run.losses(run.losses_size() - 1), run.losses(0));
}

// Stage server processes on two GPUs, each link's transport as the job asks:
// NCCL (the link must report "nccl", never a fallback) and the chunked gRPC
// stream through pinned staging. Equal to the GPU reference.
class GpuLinks : public GpuTest, public ::testing::WithParamInterface<std::string> {};

TEST_P(GpuLinks, GptOverTwoGpuStageServersEqualsTheGpuReference) {
  if (gpus_ < 2) GTEST_SKIP() << "needs 2 GPUs";
  cli::LocalClusterOptions options;
  options.remove_run_dir = true;
  options.stages = 2;
  options.bin_dir = CONVEYOR_BIN_DIR;
  options.devices = {"cuda:0", "cuda:1"};
  auto cluster = cli::LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string yaml = std::string(kGpt) + "partition: {stages: 2}\nmicro_batches: 4\nschedule: 1f1b\ntransport: " +
                           GetParam() + "\n";
  v1::JobStatus run = testing::SubmitAndWait((*cluster)->coordinator_address(), yaml);
  ASSERT_EQ(run.state(), v1::JOB_STATE_SUCCEEDED) << run.error();
  EXPECT_EQ(run.stages(0).transport(), GetParam());
  testing::ExpectMatchesReference(run, testing::ServerParameters((*cluster)->stage_addresses(), run.job_id()),
                                  testing::Reference(yaml, "cuda:0"));
}

INSTANTIATE_TEST_SUITE_P(Transports, GpuLinks, ::testing::Values("nccl", "grpc"));

}  // namespace
}  // namespace conveyor
