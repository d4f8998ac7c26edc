// Stages on CUDA devices. Every test skips where there is no GPU (CI); on the
// GPU machine they run with TF32 off and deterministic cuDNN, against the
// reference on the same device.
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <dlfcn.h>
#include <execinfo.h>
#include <ucontext.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/local_cluster.h"
#include "common/files.h"
#include "model/dataset.h"
#include "model/device.h"
#include "model/optimizer.h"
#include "plan/job_spec.h"
#include "common/net.h"
#include "model/training.h"
#include "conveyor.grpc.pb.h"
#include "tests/support/in_process.h"
#include "tests/support/test_util.h"

namespace conveyor {
namespace {

// TF32 off in every NVIDIA library (cuBLAS and cuDNN) before any handle
// exists; LibTorch 2.x's own switches differ from version to version.
const bool kNoTf32 = [] { return setenv("NVIDIA_TF32_OVERRIDE", "0", 1) == 0; }();

// A crash prints where it happened (a test that died of SIGSEGV on the GPU
// machine left no other trace): the faulting instruction and the return
// addresses near the stack pointer, each as library + offset (symbols where
// dladdr finds them), then ends the process as the signal would.
void PrintAddress(const char* what, void* p) {
  Dl_info info = {};
  char line[512];
  int n;
  if (p != nullptr && dladdr(p, &info) != 0 && info.dli_fname != nullptr) {
    n = std::snprintf(line, sizeof line, "  %s %p = %s+%#lx %s\n", what, p, info.dli_fname,
                      static_cast<unsigned long>(static_cast<char*>(p) - static_cast<char*>(info.dli_fbase)),
                      info.dli_sname ? info.dli_sname : "");
  } else {
    n = std::snprintf(line, sizeof line, "  %s %p\n", what, p);
  }
  if (n > 0) (void)!write(STDERR_FILENO, line, static_cast<std::size_t>(std::min<int>(n, sizeof line - 1)));
}

const bool kBacktraceOnCrash = [] {
  struct sigaction sa = {};
  sa.sa_flags = SA_RESETHAND | SA_SIGINFO;
  sa.sa_sigaction = [](int sig, siginfo_t* info, void* context) {
    const char head[] = "gpu_test: fatal signal; where:\n";
    (void)!write(STDERR_FILENO, head, sizeof head - 1);
    PrintAddress("fault address", info->si_addr);
#if defined(__x86_64__)
    const auto* uc = static_cast<const ucontext_t*>(context);
    PrintAddress("instruction", reinterpret_cast<void*>(uc->uc_mcontext.gregs[REG_RIP]));
    void* const* sp = reinterpret_cast<void* const*>(uc->uc_mcontext.gregs[REG_RSP]);
    for (int i = 0; i < 48; ++i) {
      Dl_info d = {};
      if (sp[i] != nullptr && dladdr(sp[i], &d) != 0 && d.dli_fname != nullptr) PrintAddress("stack word", sp[i]);
    }
#else
    (void)context;
#endif
    void* frames[64];
    backtrace_symbols_fd(frames, backtrace(frames, 64), STDERR_FILENO);
    raise(sig);
  };
  return sigaction(SIGSEGV, &sa, nullptr) == 0 && sigaction(SIGABRT, &sa, nullptr) == 0;
}();

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

// Stage server processes (and a coordinator), one on each of `devices`, their
// folder removed when they stop; `restart_stages`: a killed server is started
// again; `data_roots`: every server's --data-root (empty: their default).
StatusOr<std::unique_ptr<cli::LocalCluster>> Servers(const std::vector<std::string>& devices,
                                                     bool restart_stages = false,
                                                     std::vector<std::string> data_roots = {}) {
  cli::LocalClusterOptions options;
  options.remove_run_dir = true;
  options.stages = static_cast<int>(devices.size());
  options.devices = devices;
  options.bin_dir = CONVEYOR_BIN_DIR;
  options.restart_stages = restart_stages;
  options.data_roots = std::move(data_roots);
  return cli::LocalCluster::Start(options);
}

// Runs `yaml` on `cluster` (restarting its servers) with server 1 killed
// (SIGKILL) once the job is past step 45; checks that the kill happened, the
// job recovered, once, and succeeded, and prints the run's events.
v1::JobStatus RunKillingServerOne(cli::LocalCluster& cluster, const std::string& yaml) {
  bool killed = false, recovered = false;
  const v1::JobStatus run = testing::SubmitAndWait(cluster.coordinator_address(), yaml, [&](const v1::JobStatus& s) {
    recovered |= s.state() == v1::JOB_STATE_RECOVERING;
    if (!killed && s.state() == v1::JOB_STATE_RUNNING && s.step() >= 45) {
      killed = true;
      cluster.Signal(1, SIGKILL);
    }
  });
  EXPECT_TRUE(killed) << "the job ended before the kill";
  EXPECT_TRUE(recovered);
  EXPECT_EQ(run.state(), v1::JOB_STATE_SUCCEEDED) << run.error();
  EXPECT_EQ(cluster.stage_restarts(), 1);
  std::string events;
  for (const auto& e : run.events()) events += e.text() + "\n";
  std::printf("events of the recovered run:\n%s", events.c_str());
  return run;
}

// cuDNN's autotuning off: the tests compare runs that must choose the same
// algorithms (memory_format auto: channels-last on the GPU, stages and
// reference alike).
const char* kConvNet =
    "model: convnet\ndata: {name: synthetic, train_samples: 256}\nbatch_size: 32\nsteps: 20\n"
    "optimizer: {name: sgd, lr: 0.05, momentum: 0.9}\nseed: 4\neval: true\ncudnn_benchmark: false\n";
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
  // The single device with cuda_graphs (conveyor train --reference) replays
  // steps 2 to 20 and takes the eager single device's steps.
  for (const char* model : {kConvNet, kGpt}) {
    const cli::ReferenceResult graphed = testing::Reference(std::string(model) + "cuda_graphs: true\n", "cuda:0");
    EXPECT_EQ(graphed.graphed_steps, 19) << model;
    testing::ExpectMatchesReference(graphed.status, graphed.parameters, testing::Reference(model, "cuda:0"));
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

// The numbers of the array `key` in a JSON object's text (`"key":[1.5,2]`).
std::vector<double> JsonNumbers(const std::string& json, const std::string& key) {
  std::vector<double> v;
  const std::string open = "\"" + key + "\":[";
  const size_t at = json.find(open);
  if (at == std::string::npos) return v;
  const char* p = json.c_str() + at + open.size();
  while (*p != ']' && *p != '\0') {
    char* end = nullptr;
    v.push_back(std::strtod(p, &end));
    if (end == p) break;
    p = end;
    if (*p == ',') ++p;
  }
  return v;
}

// `conveyor local` starts one stage server per GPU: on two GPUs a job of four
// stages runs as two, each server holding two of them, and trains as the
// reference does.
TEST_F(GpuTest, ConveyorLocalFoldsFourStagesOntoOneServerPerGpu) {
  if (gpus_ < 2) GTEST_SKIP() << "needs two GPUs";
  const std::string dir = testing::MakeTempDir("gpu-fold");
  const std::string job = dir + "/fold.yaml";
  {
    std::ofstream out(job);
    out << kGpt << "partition: {stages: 4}\nmicro_batches: 4\nschedule: gpipe\n";
  }
  auto ref = testing::RunCommand({testing::Binary("conveyor"), "train", job, "--reference", "--json", "--device", "cuda:0"});
  auto local = testing::RunCommand({"env", "CUDA_VISIBLE_DEVICES=0,1", testing::Binary("conveyor"), "local", job,
                                    "--json", "--curves", ""});
  // Not std::filesystem::remove_all: the PyTorch wheel's libtorch.so exports its
  // own copy of it, which this process then calls, and that copy jumped to
  // address 0 (a SIGSEGV in this test on the GPU machine, three times).
  RemoveTree(dir);
  ASSERT_EQ(ref.exit_code, 0) << ref.err;
  ASSERT_EQ(local.exit_code, 0) << local.err;
  EXPECT_THAT(local.err, ::testing::HasSubstr("running them as 2, one stage server per GPU"));
  EXPECT_THAT(local.err, ::testing::HasSubstr("starting 2 stage server(s) on GPUs"));
  EXPECT_THAT(local.err, ::testing::HasSubstr(") cuda:1,"));  // the summary's second stage
  // The losses of the --json outputs.
  const std::vector<double> x = JsonNumbers(local.out, "losses"), y = JsonNumbers(ref.out, "losses");
  ASSERT_EQ(x.size(), 20u) << local.out;
  ASSERT_EQ(x.size(), y.size()) << ref.out;
  for (std::size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(x[i], y[i], 1e-4 + 1e-4 * std::abs(y[i])) << "step " << i + 1;
}

// Every training step after the first replays CUDA graphs, and the result is
// the eager reference's: BatchNorm's running statistics (one micro-batch, as
// above), the loss on the last stage, micro-batches in flight under 1F1B and
// two chunks per GPU interleaved.
TEST_F(GpuTest, CudaGraphsEqualTheGpuReference) {
  const std::vector<std::string> jobs = {
      std::string(kConvNet) + "partition: {stages: 2}\nmicro_batches: 1\nschedule: gpipe\n",
      std::string(kGpt) + "partition: {stages: 2}\nmicro_batches: 4\nschedule: 1f1b\n",
      std::string(kGpt) + "partition: {stages: 2}\nmicro_batches: 4\nschedule: interleaved\nvirtual_stages: 2\n",
  };
  for (const std::string& yaml : jobs) {
    testing::InProcessCluster cluster(2, nullptr, Devices(2));
    auto coordinator = cluster.StartCoordinator();
    v1::JobStatus run = testing::RunToEnd(*coordinator, yaml + "cuda_graphs: true\n");
    ASSERT_EQ(run.state(), v1::JOB_STATE_SUCCEEDED) << run.error() << "\n" << yaml;
    for (const auto& stage : run.stages()) EXPECT_EQ(stage.graphed_steps(), 19) << stage.index() << "\n" << yaml;
    testing::ExpectMatchesReference(run, cluster.Parameters(run.job_id(), 2), testing::Reference(yaml, "cuda:0"));
  }
}

// W1's settings on the GPU together: channels-last, cuDNN autotuning and
// CUDA graphs, on one stage and across two (activations and gradients cross
// channels-last), train as the contiguous reference without autotuning does,
// within what other convolution algorithms' rounding moves in 20 steps
// (autotuning picks by timing, so the algorithms differ from run to run): on
// an H100 the parameters (up to 0.2) differed by 5e-4 in one run and 1.2e-3
// in another, the losses by less than 1e-3 of their value; 1 and 2 stages
// alike (the layout crosses the boundary exactly). A layout mistake moves
// them by their own size.
TEST_F(GpuTest, ChannelsLastWithAutotuningAndGraphsTrainsAsTheContiguousReference) {
  const cli::ReferenceResult ref =
      testing::Reference(std::string(kConvNet) + "memory_format: contiguous\n", "cuda:0");
  for (int stages : {1, 2}) {
    const std::string yaml = std::string(kConvNet) + "partition: {stages: " + std::to_string(stages) +
                             "}\nmicro_batches: 1\nschedule: gpipe\nmemory_format: channels_last\n"
                             "cudnn_benchmark: true\ncuda_graphs: true\n";
    testing::InProcessCluster cluster(stages, nullptr, Devices(stages));
    auto coordinator = cluster.StartCoordinator();
    v1::JobStatus run = testing::RunToEnd(*coordinator, yaml);
    at::globalContext().setBenchmarkCuDNN(false);
    ASSERT_EQ(run.state(), v1::JOB_STATE_SUCCEEDED) << run.error();
    for (const auto& stage : run.stages()) EXPECT_EQ(stage.graphed_steps(), 19) << stage.index();
    ASSERT_EQ(run.losses_size(), ref.status.losses_size());
    for (int i = 0; i < run.losses_size(); ++i)
      EXPECT_NEAR(run.losses(i), ref.status.losses(i), 1e-4 + 1e-3 * std::abs(ref.status.losses(i))) << i;
    const auto params = cluster.Parameters(run.job_id(), stages);
    ASSERT_EQ(params.size(), ref.parameters.size());
    for (std::size_t i = 0; i < params.size(); ++i)
      EXPECT_TRUE(at::allclose(params[i].second.cpu(), ref.parameters[i].second.cpu(), 1e-3, 3e-3))
          << params[i].first << " on " << stages << " stage(s): largest difference "
          << (params[i].second.cpu().to(at::kDouble) - ref.parameters[i].second.cpu().to(at::kDouble)).abs().max().item<double>()
          << ", largest value " << ref.parameters[i].second.cpu().abs().max().item<double>();
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

// Out of memory is an answer, not a crash: a job whose activations need some
// 300 GB (ResNet50 at 160x160 keeps tens of MB a sample for its backward;
// 4096 samples in one micro-batch, each tensor under the 2^31 elements that
// cuDNN's kernels index) fails with RESOURCE_EXHAUSTED naming the stage, what
// it held and the allocation that failed; the same stage server process then
// trains a small job.
TEST_F(GpuTest, OutOfMemoryFailsTheJobAndTheServerServesTheNext) {
  cli::LocalClusterOptions options;
  options.remove_run_dir = true;
  options.stages = 1;
  options.devices = {"cuda:0"};
  options.bin_dir = CONVEYOR_BIN_DIR;
  auto cluster = cli::LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string address = (*cluster)->coordinator_address();
  const v1::JobStatus huge = testing::SubmitAndWait(
      address,
      "model: {name: resnet50, image_size: 160, num_classes: 10}\npartition: {stages: 1}\n"
      "data: {name: synthetic, train_samples: 4096, test_samples: 0}\nbatch_size: 4096\nmicro_batches: 1\n"
      "optimizer: {name: sgd, lr: 0.001, momentum: 0.9}\nloss: mse\nsteps: 2\ncudnn_benchmark: false\n");
  ASSERT_EQ(huge.state(), v1::JOB_STATE_FAILED) << huge.error();
  EXPECT_EQ(huge.error_code(), "RESOURCE_EXHAUSTED") << huge.error();
  EXPECT_THAT(huge.error(), ::testing::HasSubstr("stage 0 step 0"));
  EXPECT_THAT(huge.error(), ::testing::HasSubstr("out of memory"));
  EXPECT_THAT(huge.error(), ::testing::HasSubstr("holding parameters "));
  EXPECT_THAT(huge.error(), ::testing::HasSubstr("the allocation that failed: "));
  EXPECT_THAT(huge.error(), ::testing::HasSubstr("caching allocator reserved "));
  const v1::JobStatus small = testing::SubmitAndWait(address, std::string(kConvNet) + "partition: {stages: 1}\n");
  EXPECT_EQ(small.state(), v1::JOB_STATE_SUCCEEDED) << small.error();
  EXPECT_EQ(small.stages(0).device(), "cuda:0");
}

// Recovery on NCCL links (issue 22): a job of two stage server processes on
// two GPUs with an NCCL link between them; the downstream server is killed
// (SIGKILL) in the middle of a step and restarted at its address; the job
// resumes from its last checkpoint over a new NCCL link and ends with the
// digest of the same job run without the kill on the same servers. An MLP
// (linear layers, cuBLAS) with AdamW: its steps are bit-reproducible on one
// GPU, so the digests must be equal, not close. Needs two GPUs.
TEST_F(GpuTest, AStageKilledOnAnNcclLinkResumesToTheUninterruptedDigest) {
  if (gpus_ < 2) GTEST_SKIP() << "needs two GPUs";
  auto cluster = Servers({"cuda:0", "cuda:1"}, /*restart_stages=*/true);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string address = (*cluster)->coordinator_address();
  const std::string yaml =
      "model: {name: mlp, input_dim: 64, hidden: [256, 256, 128]}\npartition: {stages: 2}\n"
      "data: {name: synthetic, train_samples: 4096}\nbatch_size: 64\nmicro_batches: 4\nschedule: 1f1b\n"
      "optimizer: {name: adamw, lr: 0.001, weight_decay: 0.1}\ntransport: nccl\nseed: 3\nsteps: 120\n"
      "checkpoint_every: 10\nstage_timeout: 10\nrecovery_timeout: 60\n";
  const v1::JobStatus clean = testing::SubmitAndWait(address, yaml);
  ASSERT_EQ(clean.state(), v1::JOB_STATE_SUCCEEDED) << clean.error();
  ASSERT_EQ(clean.stages(0).transport(), v1::LINK_NCCL);
  const v1::JobStatus run = RunKillingServerOne(**cluster, yaml);
  if (HasFailure()) return;  // the helper said why
  EXPECT_EQ(run.stages(0).transport(), v1::LINK_NCCL);
  EXPECT_EQ(run.stages(1).device(), "cuda:1");
  EXPECT_EQ(run.param_digest(), clean.param_digest());
}

// Stage server processes on two GPUs over NCCL and the gRPC stream: the Nccl
// cases of PipelineEquality (equality_test.cpp), parameterised over transports.

// The loader's prefetched batch (pinned host memory, copied asynchronously)
// is the batch it gathers when nothing was prefetched, and a prefetch of
// another step than the one asked for is not used.
TEST_F(GpuTest, PrefetchedBatchesEqualGatheredOnes) {
  auto spec = ParseJobYaml(kConvNet);
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto data = Dataset::Open(*spec, true, true);
  ASSERT_TRUE(data.ok()) << data.status();
  const at::Device gpu("cuda:0");
  BatchLoader plain(*spec, data->get(), gpu, true, true), ahead(*spec, data->get(), gpu, true, true);
  for (int64_t step : {0, 1, 2, 7, 3}) {
    ahead.Prefetch(v1::PHASE_TRAIN, step == 7 ? 8 : step);  // step 7: a prefetch that does not match
    BatchLoader::Batch a = ahead.Get(v1::PHASE_TRAIN, step), p = plain.Get(v1::PHASE_TRAIN, step);
    ASSERT_TRUE(a.inputs.is_cuda());
    EXPECT_TRUE(a.inputs.equal(p.inputs)) << "step " << step;
    EXPECT_TRUE(a.labels.equal(p.labels)) << "step " << step;
    EXPECT_TRUE(a.inputs.cpu().equal(ToModel(*spec, (*data)->Inputs(v1::PHASE_TRAIN, step), at::kCPU)));
  }
}

// The multi-tensor SGD, Adam and AdamW steps and the gradient norm on CUDA
// (a few launches over all tensors) against LibTorch's loop and the CPU's
// norms: the same numbers within fp32 rounding (the kernels may fuse multiply
// and add differently; LibTorch's division by a scalar multiplies by its
// reciprocal).
TEST_F(GpuTest, ForeachOptimizersAndNormOnCudaMatchTheLoop) {
  for (v1::OptimizerKind kind : {v1::OPTIMIZER_SGD, v1::OPTIMIZER_ADAM, v1::OPTIMIZER_ADAMW}) {
    v1::OptimizerSpec o;
    o.set_kind(kind);
    o.set_lr(kind == v1::OPTIMIZER_SGD ? 0.05 : 1e-3);
    o.set_momentum(0.9);
    o.set_beta1(0.9);
    o.set_beta2(0.95);
    o.set_eps(1e-8);
    o.set_weight_decay(1e-4);
    auto make = [&](bool per_tensor, NamedTensors* named) {
      at::manual_seed(7);
      named->clear();
      for (int i = 0; i < 20; ++i)
        named->emplace_back("p" + std::to_string(i), at::randn({17 * (i + 1), 3}).cuda().requires_grad_());
      v1::OptimizerSpec spec = o;
      spec.set_per_tensor(per_tensor);
      return MakeOptimizer(spec, *named);
    };
    NamedTensors loop_params, foreach_params;
    auto loop = make(true, &loop_params);
    auto foreach = make(false, &foreach_params);
    for (int step = 0; step < 5; ++step) {
      at::manual_seed(100 + step);
      std::vector<at::Tensor> grads;
      for (const auto& [name, p] : loop_params) grads.push_back(at::randn_like(p));
      std::vector<at::Tensor> with_grads;
      for (std::size_t i = 0; i < grads.size(); ++i) {
        loop_params[i].second.mutable_grad() = grads[i].clone();
        foreach_params[i].second.mutable_grad() = grads[i].clone();
        with_grads.push_back(foreach_params[i].second);
      }
      std::vector<at::Tensor> on_cpu;
      for (const auto& p : with_grads) {
        on_cpu.push_back(at::zeros_like(p, at::kCPU));
        on_cpu.back().mutable_grad() = p.grad().cpu();
      }
      EXPECT_NEAR(GradSquaredNorm(with_grads), GradSquaredNorm(on_cpu), 1e-5 * GradSquaredNorm(on_cpu))
          << "step " << step;
      loop->step();
      foreach->step();
    }
    for (std::size_t i = 0; i < loop_params.size(); ++i)
      EXPECT_TRUE(at::allclose(loop_params[i].second, foreach_params[i].second, 1e-5, 1e-6))
          << v1::OptimizerKind_Name(kind) << " " << loop_params[i].first;
  }
}

// On CUDA the single device reads a step's loss and norm only once the next
// step is launched (the device does not wait for the host between steps): a
// non-finite norm still fails the run naming its own step, and says the next
// step's update was launched too.
TEST_F(GpuTest, ANonFiniteNormReadOneStepLateFailsTheReferenceAtItsStep) {
  auto spec = ParseJobYaml(std::string(kGpt) + "inject_inf_gradients: [{stage: 0, step: 5}]\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  cli::ReferenceOptions options;
  options.device = "cuda:0";
  auto ref = cli::TrainReference(*spec, options);
  ASSERT_FALSE(ref.ok());
  EXPECT_EQ(ref.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(ref.status().message()),
              ::testing::HasSubstr("step 6: the gradient norm is not finite; found after its update and the next "
                                   "step's were launched on the GPU"));
}

// model.fused and the bf16 gradient norm on CUDA (issue 19): W2's kernels at
// a small size train as the plain ones within bf16's rounding (cuDNN's and
// flash attention's backward sum in an order of their own), and the norm of
// bf16 gradients from one _foreach_norm equals the per-tensor fp32 norms.
TEST_F(GpuTest, GptFusedQkvAndBf16NormOnCudaMatchThePlainOnes) {
  auto job = [](const char* fused) {
    return std::string("model: {name: gpt, vocab: 64, width: 128, blocks: 2, heads: 2, seq_len: 32, fused: ") +
           fused +
           "}\ndata: {name: synthetic, train_samples: 32, test_samples: 0}\nbatch_size: 8\nsteps: 4\n"
           "precision: bf16\noptimizer: {name: sgd, lr: 0.1}\n";
  };
  const cli::ReferenceResult fused = testing::Reference(job("true"), "cuda:0");
  const cli::ReferenceResult plain = testing::Reference(job("false"), "cuda:0");
  ASSERT_EQ(fused.status.losses_size(), 4);
  for (int i = 0; i < 4; ++i)
    EXPECT_NEAR(fused.status.losses(i), plain.status.losses(i), 1e-2 * std::abs(plain.status.losses(i))) << i + 1;
  for (std::size_t i = 0; i < fused.parameters.size(); ++i) {
    EXPECT_TRUE(at::allclose(fused.parameters[i].second.to(at::kFloat), plain.parameters[i].second.to(at::kFloat),
                             2e-2, 2e-3))
        << fused.parameters[i].first;
  }
  std::vector<at::Tensor> on_gpu, on_cpu;
  at::manual_seed(5);
  for (int i = 0; i < 12; ++i) {
    on_gpu.push_back(at::zeros({300 * (i + 1)}, at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA)));
    on_gpu.back().mutable_grad() = at::randn({300 * (i + 1)}).to(at::kBFloat16).cuda();
    on_cpu.push_back(at::zeros({1}));
    on_cpu.back().mutable_grad() = on_gpu.back().grad().cpu();
  }
  const double cpu = GradSquaredNorm(on_cpu);
  EXPECT_NEAR(GradSquaredNorm(on_gpu), cpu, 1e-5 * cpu);
  // Cross-entropy reads bf16 logits into an fp32 softmax: cross_entropy of
  // their fp32 copy, value and gradient, bit for bit.
  const at::Tensor logits = at::randn({64, 1000}).to(at::kBFloat16).cuda().requires_grad_();
  const at::Tensor copy = logits.detach().clone().requires_grad_();
  const at::Tensor labels = at::randint(1000, {64}, at::TensorOptions().dtype(at::kLong).device(at::kCUDA));
  const at::Tensor loss = ComputeLoss(v1::JobSpec(), logits, labels, 1.0);
  const at::Tensor ref = at::cross_entropy_loss(copy.to(at::kFloat), labels);
  EXPECT_EQ(loss.scalar_type(), at::kFloat);
  EXPECT_EQ(loss.item<float>(), ref.item<float>());
  loss.backward();
  ref.backward();
  EXPECT_TRUE(at::equal(logits.grad(), copy.grad()));
}

// Data parallelism on one GPU (issue 20): two stage server processes on
// cuda:0, two replicas of a one-stage GPT, their CUDA gradients all-reduced
// through c10d's Gloo group (NCCL would need a GPU each), equal the GPU
// reference on the whole batch; the coordinator checks that both copies end
// bit for bit the same. Skips where the build has no Gloo group.
TEST_F(GpuTest, TwoReplicasOnOneGpuEqualTheGpuReference) {
  auto cluster = Servers({"cuda:0", "cuda:0"});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string yaml = std::string(kGpt) + "partition: {stages: 1}\nreplicas: 2\nmicro_batches: 2\n"
                           "schedule: 1f1b\nbucket_cap_mb: 0.01\n";
  const v1::JobStatus run = testing::SubmitAndWait((*cluster)->coordinator_address(), yaml);
  if (run.state() == v1::JOB_STATE_FAILED && run.error_code() == "UNIMPLEMENTED")
    GTEST_SKIP() << "this build has no c10d Gloo group: " << run.error();
  ASSERT_EQ(run.state(), v1::JOB_STATE_SUCCEEDED) << run.error();
  ASSERT_EQ(run.stages_size(), 2);
  EXPECT_EQ(run.stages(1).replica(), 1);
  EXPECT_EQ(run.stages(1).device(), "cuda:0");
  const cli::ReferenceResult ref = testing::Reference(yaml, "cuda:0");
  ASSERT_EQ(run.losses_size(), ref.status.losses_size());
  for (int i = 0; i < run.losses_size(); ++i)
    EXPECT_NEAR(run.losses(i), ref.status.losses(i), 1e-4 + 1e-4 * std::abs(ref.status.losses(i))) << "step " << i + 1;
}

// zero 1 with the state on a GPU: three replicas of a one-stage GPT on one
// GPU (Gloo over CUDA tensors), AdamW, checkpoints every 5 steps. Each
// checkpoint gathers the copies' parts of the state whole on the device
// (GradientReducer::GatherWhole); replica 0's server is lost after the
// checkpoint of step 10, and the two replicas left cut that state into
// halves (PartsOf) and go on. The losses stay the uninterrupted run's (the
// same sums in another order). One GPU is enough.
TEST_F(GpuTest, ZeroOneReplicasOnOneGpuLoseOneAndGoOnFromTheWholeState) {
  const std::string yaml =
      "model: {name: gpt, vocab: 64, width: 32, blocks: 4, heads: 4, seq_len: 16}\n"
      "data: {name: synthetic, train_samples: 480}\nbatch_size: 24\nsteps: 200\n"
      "optimizer: {name: adamw, lr: 0.001, weight_decay: 0.1}\npartition: {stages: 1}\nreplicas: 3\n"
      "zero: 1\nbucket_cap_mb: 0.01\nmicro_batches: 2\ncheckpoint_every: 5\nstage_timeout: 30\n";
  v1::JobStatus clean;
  {
    auto cluster = Servers({"cuda:0", "cuda:0", "cuda:0"});
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    clean = testing::SubmitAndWait((*cluster)->coordinator_address(), yaml);
    if (clean.state() == v1::JOB_STATE_FAILED && clean.error_code() == "UNIMPLEMENTED")
      GTEST_SKIP() << "this build has no c10d Gloo group: " << clean.error();
    ASSERT_EQ(clean.state(), v1::JOB_STATE_SUCCEEDED) << clean.error();
  }
  auto cluster = Servers({"cuda:0", "cuda:0", "cuda:0"});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  bool killed = false;
  const v1::JobStatus end = testing::SubmitAndWait(
      (*cluster)->coordinator_address(), yaml + "recovery_timeout: 60\nlost_after: 1\n", [&](const v1::JobStatus& s) {
        if (!killed && s.checkpoint_step() >= 10) {
          killed = true;
          (*cluster)->Signal(0, SIGKILL);
        }
      });
  std::string events;
  for (const auto& e : end.events()) events += "  " + e.text() + "\n";
  ASSERT_TRUE(killed) << "the job ended before the kill";
  ASSERT_EQ(end.state(), v1::JOB_STATE_SUCCEEDED) << end.error() << "\n" << events;
  EXPECT_EQ(end.stages_size(), 2) << events;
  EXPECT_THAT(events, ::testing::HasSubstr("the job goes on as 2 replica(s)"));
  EXPECT_THAT(events, ::testing::Not(::testing::HasSubstr("starts again from step 0")));
  // cuBLAS picks its kernels by the rows each copy holds (8, then 12): the
  // same sums to rounding, not bit for bit.
  ASSERT_EQ(end.losses_size(), clean.losses_size());
  double worst = 0;
  for (int i = 0; i < end.losses_size(); ++i) {
    worst = std::max(worst, std::abs(double(end.losses(i)) - clean.losses(i)) / std::abs(double(clean.losses(i))));
    EXPECT_NEAR(end.losses(i), clean.losses(i), 1e-3 * std::abs(clean.losses(i))) << "step " << i + 1;
  }
  std::printf("largest relative difference of a loss from the uninterrupted run: %.3g\n", worst);
}

// Data parallelism over two GPUs (issue 32): one stage server per GPU, two
// replicas of a one-stage GPT, their gradients summed by NCCL on the devices
// in several buckets (collectives auto takes NCCL: each copy has a GPU of
// its own), equal the GPU reference on the whole batch, in fp32 and in
// bf16-mixed (autocast rounds the two halves' activations as the whole
// batch's: the same matmuls row by row, so a looser bound than fp32's only
// for cuBLAS's choice of kernels by batch size). The coordinator checks that
// both copies end bit for bit the same. Needs two GPUs.
// Two replicas of `stages` stages, one server a GPU, fp32 and bf16-mixed:
// NCCL collectives on every stage, losses as the GPU reference's.
void ExpectTwoReplicasEqualTheReference(int stages) {
  std::vector<std::string> devices;
  for (int i = 0; i < 2 * stages; ++i) devices.push_back("cuda:" + std::to_string(i));
  auto cluster = Servers(devices);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  for (const std::string precision : {"fp32", "bf16-mixed"}) {
    const std::string yaml = std::string(kGpt) + "partition: {stages: " + std::to_string(stages) +
                             "}\nreplicas: 2\nmicro_batches: 2\nschedule: 1f1b\nbucket_cap_mb: 0.01\nprecision: " +
                             precision + "\n";
    const v1::JobStatus run = testing::SubmitAndWait((*cluster)->coordinator_address(), yaml);
    if (run.state() == v1::JOB_STATE_FAILED && run.error_code() == "UNIMPLEMENTED")
      GTEST_SKIP() << "this build has no c10d Gloo group (the NCCL group's id travels through its store): "
                   << run.error();
    ASSERT_EQ(run.state(), v1::JOB_STATE_SUCCEEDED) << run.error();
    ASSERT_EQ(run.stages_size(), 2 * stages);
    for (int i = 0; i < run.stages_size(); ++i) {
      EXPECT_EQ(run.stages(i).collectives(), v1::COLLECTIVES_NCCL) << precision;
      EXPECT_EQ(run.stages(i).device(), devices[static_cast<std::size_t>(i)]);
      // Replicas of one stage replay their passes in fp32 (cuda_graphs auto),
      // the buckets all-reduced after the replays.
      if (stages == 1 && precision == "fp32") EXPECT_GT(run.stages(i).graphed_steps(), 0) << "stage " << i;
    }
    const cli::ReferenceResult ref = testing::Reference(yaml, "cuda:0");
    const double rel = precision == "fp32" ? 1e-4 : 2e-2;
    ASSERT_EQ(run.losses_size(), ref.status.losses_size());
    for (int i = 0; i < run.losses_size(); ++i)
      EXPECT_NEAR(run.losses(i), ref.status.losses(i), 1e-4 + rel * std::abs(ref.status.losses(i)))
          << precision << " step " << i + 1;
  }
}

TEST_F(GpuTest, TwoReplicasOnTwoGpusSumOverNcclAndEqualTheGpuReference) {
  if (gpus_ < 2) GTEST_SKIP() << "needs two GPUs";
  ExpectTwoReplicasEqualTheReference(1);
}

// 2 x 2: NCCL links between the stages, NCCL collectives between the copies.
TEST_F(GpuTest, TwoReplicasOfTwoStagesOnFourGpusEqualTheGpuReference) {
  if (gpus_ < 4) GTEST_SKIP() << "needs four GPUs";
  ExpectTwoReplicasEqualTheReference(2);
}

// collectives: nccl where the copies of a stage share a GPU is refused before
// the job starts, naming the stage; collectives: gloo on two GPUs is taken
// as asked.
TEST_F(GpuTest, NcclCollectivesOnOneGpuAreRefusedNamingTheStage) {
  auto cluster = Servers({"cuda:0", "cuda:0"});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string yaml = std::string(kGpt) + "partition: {stages: 1}\nreplicas: 2\n";
  const v1::JobStatus refused = testing::SubmitAndWait((*cluster)->coordinator_address(), yaml + "collectives: nccl\n");
  ASSERT_EQ(refused.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(refused.error_code(), "FAILED_PRECONDITION") << refused.error();
  EXPECT_THAT(refused.error(), ::testing::HasSubstr("the copies of stage 0 cannot sum their gradients with NCCL"));
  const v1::JobStatus gloo = testing::SubmitAndWait((*cluster)->coordinator_address(), yaml);
  if (gloo.state() == v1::JOB_STATE_FAILED && gloo.error_code() == "UNIMPLEMENTED")
    GTEST_SKIP() << "this build has no c10d Gloo group: " << gloo.error();
  ASSERT_EQ(gloo.state(), v1::JOB_STATE_SUCCEEDED) << gloo.error();
  EXPECT_EQ(gloo.stages(0).collectives(), v1::COLLECTIVES_GLOO);
}

// Recovery with NCCL collectives: replica 1's stage server on cuda:1 is
// killed (SIGKILL) in the middle of a step while replica 0's waits for their
// all-reduce; the coordinator aborts the step (the survivor's wait ends at
// once, its communicator aborted), the server is restarted at its address,
// and the job resumes from its last checkpoint over a new NCCL group to the
// digest of the uninterrupted run (an MLP with AdamW: bit-reproducible).
TEST_F(GpuTest, AReplicaKilledDuringItsNcclAllReduceResumesToTheUninterruptedDigest) {
  if (gpus_ < 2) GTEST_SKIP() << "needs two GPUs";
  auto cluster = Servers({"cuda:0", "cuda:1"}, /*restart_stages=*/true);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string address = (*cluster)->coordinator_address();
  const std::string yaml =
      "model: {name: mlp, input_dim: 64, hidden: [256, 256, 128]}\npartition: {stages: 1}\nreplicas: 2\n"
      "data: {name: synthetic, train_samples: 4096}\nbatch_size: 64\nmicro_batches: 2\n"
      "optimizer: {name: adamw, lr: 0.001, weight_decay: 0.1}\ncollectives: nccl\nbucket_cap_mb: 0.05\nseed: 3\n"
      "steps: 120\ncheckpoint_every: 10\nstage_timeout: 10\nrecovery_timeout: 60\n";
  const v1::JobStatus clean = testing::SubmitAndWait(address, yaml);
  if (clean.state() == v1::JOB_STATE_FAILED && clean.error_code() == "UNIMPLEMENTED")
    GTEST_SKIP() << "this build has no c10d Gloo group: " << clean.error();
  ASSERT_EQ(clean.state(), v1::JOB_STATE_SUCCEEDED) << clean.error();
  const v1::JobStatus run = RunKillingServerOne(**cluster, yaml);
  if (HasFailure()) return;  // the helper said why
  EXPECT_EQ(run.stages(1).collectives(), v1::COLLECTIVES_NCCL);
  EXPECT_EQ(run.param_digest(), clean.param_digest());
}

// ZeRO-1 over NCCL on two GPUs: a 2 x 1 GPT with AdamW whose optimizer state
// is split between the two copies (each updates its slices of the buckets,
// reduce-scattered and all-gathered on the devices) ends bit for bit where the unsharded run
// does, each copy holding part of the state. Needs two GPUs.
TEST_F(GpuTest, ZeroOneOverNcclOnTwoGpusEqualsTheUnshardedRun) {
  if (gpus_ < 2) GTEST_SKIP() << "needs two GPUs";
  auto cluster = Servers({"cuda:0", "cuda:1"});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string yaml =
      "model: {name: gpt, vocab: 64, width: 32, blocks: 4, heads: 4, seq_len: 16}\n"
      "data: {name: synthetic, train_samples: 128}\nbatch_size: 16\nsteps: 12\n"
      "optimizer: {name: adamw, lr: 0.001, weight_decay: 0.1}\npartition: {stages: 1}\nreplicas: 2\n"
      "micro_batches: 2\n";
  v1::JobStatus runs[2];
  for (int zero : {0, 1}) {
    runs[zero] = testing::SubmitAndWait((*cluster)->coordinator_address(), yaml + "zero: " + std::to_string(zero) + "\n");
    if (runs[zero].state() == v1::JOB_STATE_FAILED && runs[zero].error_code() == "UNIMPLEMENTED")
      GTEST_SKIP() << "this build has no c10d Gloo group: " << runs[zero].error();
    ASSERT_EQ(runs[zero].state(), v1::JOB_STATE_SUCCEEDED) << "zero " << zero << ": " << runs[zero].error();
    ASSERT_EQ(runs[zero].stages_size(), 2);
    EXPECT_EQ(runs[zero].stages(0).collectives(), v1::COLLECTIVES_NCCL);
  }
  EXPECT_EQ(runs[1].param_digest(), runs[0].param_digest());
  const int64_t whole = runs[0].stages(0).optimizer_state_bytes();
  EXPECT_EQ(runs[1].stages(0).optimizer_state_bytes() + runs[1].stages(1).optimizer_state_bytes(), whole);
  EXPECT_LT(runs[1].stages(0).optimizer_state_bytes(), whole);
}

// Issue 35, live against PyTorch 2: the GPU machine's python3 (PyTorch 2.x)
// trains each program's own module (torch.export.load(PATH).module(),
// tests/python/oracle.py train --live) on the CPU in Conveyor's order, and
// Conveyor trains the program on the GPU: mlp.pt2 over two stages cut at its
// pipe_split() mark, dec.pt2 (scaled_dot_product_attention, which LibTorch
// 1.13 lacks) on one, and dec_dyn.pt2 (a dynamic batch, written by
// edit_programs.py as torch.export's serializer writes one: PyTorch 2's
// own torch.export.load reading it is part of the check) over two, and
// gpt_dyn.pt2 (export_dynamic.py's nanoGPT-style decoder that PyTorch 2.11
// exported with its batch dynamic) over two. Every
// step's loss and the evaluation within the GPU tests' bound. Skips without
// a python3 whose torch has torch.export.
TEST_F(GpuTest, ExportedProgramsTrainAsPyTorch2TrainsTheirOwnModules) {
  if (testing::RunCommand({"python3", "-c", "import sys, torch; sys.exit(0 if hasattr(torch, 'export') else 1)"})
          .exit_code != 0)
    GTEST_SKIP() << "no python3 with PyTorch 2 (torch.export)";
  const std::string dir = testing::MakeTempDir("gpu-exported");
  const std::string oracle = std::string(CONVEYOR_SOURCE_DIR) + "/tests/python/oracle.py";
  const std::vector<std::pair<std::string, int>> programs = {
      {"exported-mlp", 2}, {"exported-sdpa", 1}, {"exported-dyn", 2}, {"exported-gpt", 2}};
  for (const auto& [model, stages] : programs) {
    SCOPED_TRACE(model);
    const std::string folder = dir + "/" + model;
    auto made = testing::RunCommand({"python3", oracle, "make", model, folder});
    ASSERT_EQ(made.exit_code, 0) << made.err;
    nlohmann::json job = nlohmann::json::parse(std::ifstream(folder + "/job.json"));
    job["partition"] = {{"stages", stages}};
    job["eval"] = true;
    job["eval_batch_size"] = 10;
    std::ofstream(folder + "/job.json") << job.dump(1);
    auto ref = testing::RunCommand({"python3", oracle, "train", folder + "/job.json", folder + "/ref.json", "--live"});
    ASSERT_EQ(ref.exit_code, 0) << ref.err;
    const nlohmann::json want = nlohmann::json::parse(std::ifstream(folder + "/ref.json"));

    // The job's paths are relative to its folder.
    auto cluster = Servers(std::vector<std::string>(static_cast<std::size_t>(stages), "cuda:0"), false, {folder});
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    const v1::JobStatus run = testing::SubmitAndWait((*cluster)->coordinator_address(), job.dump());
    ASSERT_EQ(run.state(), v1::JOB_STATE_SUCCEEDED) << run.error() << "\n" << (*cluster)->LogTails(25);
    ASSERT_EQ(run.losses_size(), static_cast<int>(want["losses"].size()));
    for (int i = 0; i < run.losses_size(); ++i) {
      const double w = want["losses"][static_cast<std::size_t>(i)];
      EXPECT_NEAR(run.losses(i), w, 1e-4 + 1e-4 * std::abs(w)) << "step " << i + 1;
    }
    const double eval_loss = want["eval_loss"];
    EXPECT_NEAR(run.eval_loss(), eval_loss, 1e-4 + 1e-4 * std::abs(eval_loss));
  }
  RemoveTree(dir);
}

}  // namespace
}  // namespace conveyor
