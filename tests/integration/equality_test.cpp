// The pipeline equals the single-process reference, per-step losses and final
// parameters within rtol 1e-5/atol 1e-6 after 20 steps: one suite over the
// transports (in-memory, delayed, gRPC in this process, stage server
// processes, NCCL on 2 GPUs) x schedules x models, stage and micro-batch counts.
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <ATen/Context.h>

#include <array>
#include <cmath>
#include <cstdlib>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <random>

#include "cli/local_cluster.h"
#include "coordinator/coordinator.h"
#include "model/device.h"
#include "plan/job_spec.h"
#include "plan/schedule.h"
#include "stage_server/replica_group.h"
#include "stage_server/stage_server.h"
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

// How the stages of a case are joined.
enum class Via {
  kInProc,     // Stages in this process over the in-memory transport
  kDelayed,    // the same, every tensor held back a random time (fixed seed)
  kGrpc,       // StageServers in this process (GrpcTransportFactory, StageData) on loopback, port 0
  kProcesses,  // stage_server and coordinator processes (cli::LocalCluster)
  kNccl,       // stage_server processes on 2 GPUs, links over NCCL
  kGpuGrpc,    // the same over the chunked gRPC stream (pinned staging)
};

const char* ViaName(Via via) {
  switch (via) {
    case Via::kInProc: return "inproc";
    case Via::kDelayed: return "delayed";
    case Via::kGrpc: return "grpc";
    case Via::kProcesses: return "processes";
    case Via::kNccl: return "nccl";
    case Via::kGpuGrpc: return "gpu_grpc";
  }
  return "?";
}

struct Case {
  Via via;
  std::string model;
  int stages;
  int micro_batches;
  std::string schedule;
  std::string extra = "";  // more job keys
  int replicas = 1;        // copies of the pipeline, on replicas x stages servers
};
void PrintTo(const Case& c, std::ostream* os) {
  *os << ViaName(c.via) << ", " << c.model << ", " << c.stages << " stages, " << c.micro_batches
      << " micro-batches, " << c.schedule << (c.extra.empty() ? "" : ", ") << c.extra;
  if (c.replicas > 1) *os << ", " << c.replicas << " replicas";
}

// A GPT that fits two GPUs' test budget; convolutions are left out on GPUs
// (cuDNN picks its algorithms by batch size: micro-batched ConvNets drift
// ~1e-3 from the full-batch reference there).
const char* kGpuGpt =
    "model: {name: gpt, vocab: 64, width: 32, blocks: 4, heads: 4, seq_len: 16}\n"
    "data: {name: synthetic, train_samples: 128}\nbatch_size: 16\nsteps: 20\n"
    "optimizer: {name: sgd, lr: 0.05, momentum: 0.9}\n";

// One run of a job on freshly started stages: its final status and parameters.
struct RunResult {
  v1::JobStatus status;
  std::vector<std::pair<std::string, at::Tensor>> parameters;
};

RunResult RunInProcess(const Case& c, const std::string& yaml) {
  DelayedTransportFactory::Delay delay;
  if (c.via == Via::kDelayed) {
    auto rng = std::make_shared<std::mt19937_64>(16);
    auto mu = std::make_shared<std::mutex>();
    delay = [rng, mu] {
      std::lock_guard<std::mutex> lock(*mu);
      return std::chrono::microseconds((*rng)() % 300);
    };
  }
  InProcessCluster cluster(c.stages * c.replicas, delay);
  auto coordinator = cluster.StartCoordinator();
  RunResult run;
  run.status = RunToEnd(*coordinator, yaml);
  run.parameters = cluster.Parameters(run.status.job_id(), c.stages);
  return run;
}

// Stage servers in this process, a coordinator over their gRPC addresses.
RunResult RunOverGrpcInProcess(const Case& c, const std::string& yaml) {
  std::vector<std::unique_ptr<StageServer>> servers;
  CoordinatorOptions options;
  for (int i = 0; i < c.stages * c.replicas; ++i) {
    StageServerOptions o;
    o.threads = 1;
    auto server = StageServer::Start(o);
    EXPECT_TRUE(server.ok()) << server.status();
    if (!server.ok()) return {};
    options.stages.push_back((*server)->address());
    servers.push_back(std::move(*server));
  }
  auto coordinator = Coordinator::Start(options);
  EXPECT_TRUE(coordinator.ok()) << coordinator.status();
  if (!coordinator.ok()) return {};
  RunResult run;
  run.status = RunToEnd(**coordinator, yaml);
  // Replica 0's stages (the replicas' copies are checked equal by the job's digest).
  run.parameters = testing::ServerParameters({options.stages.begin(), options.stages.begin() + c.stages},
                                             run.status.job_id());
  coordinator->reset();
  // Each server waits out a grace period (2 s) for the stream its neighbour
  // still has open: all at once, not one after another.
  std::vector<std::future<void>> stops;
  for (auto& server : servers) stops.push_back(std::async(std::launch::async, [&server] { server->Shutdown(); }));
  for (auto& stop : stops) stop.wait();
  return run;
}

RunResult RunOverProcesses(const Case& c, const std::string& yaml, std::vector<std::string> devices) {
  cli::LocalClusterOptions options;
  options.remove_run_dir = true;
  options.stages = c.stages * c.replicas;
  options.bin_dir = CONVEYOR_BIN_DIR;
  options.threads_per_stage = 1;
  options.devices = std::move(devices);
  auto cluster = cli::LocalCluster::Start(options);
  EXPECT_TRUE(cluster.ok()) << cluster.status();
  if (!cluster.ok()) return {};
  RunResult run;
  run.status = testing::SubmitAndWait((*cluster)->coordinator_address(), yaml);
  const std::vector<std::string>& all = (*cluster)->stage_addresses();
  run.parameters = testing::ServerParameters({all.begin(), all.begin() + c.stages}, run.status.job_id());
  return run;
}

// TF32 off in cuBLAS and cuDNN before any handle exists (as gpu_test does).
const bool kNoTf32 = [] { return setenv("NVIDIA_TF32_OVERRIDE", "0", 1) == 0; }();

class PipelineEquality : public ::testing::TestWithParam<Case> {
 protected:
  static void SetUpTestSuite() { at::set_num_threads(1); }
};

TEST_P(PipelineEquality, PipelinedRunEqualsTheReference) {
  const Case& c = GetParam();
  const bool gpu = c.via == Via::kNccl || c.via == Via::kGpuGrpc;
  if (gpu && CudaDeviceCount() < 2) {
    GTEST_SKIP() << "GPU cases need 2 CUDA devices; this machine has " << CudaDeviceCount();
  }
  std::string yaml = (gpu ? std::string(kGpuGpt) : kModels.at(c.model)) + "partition: {stages: " +
                     std::to_string(c.stages) + "}\nmicro_batches: " + std::to_string(c.micro_batches) +
                     "\nschedule: " + c.schedule + "\n" + c.extra;
  if (c.schedule == "interleaved") yaml += "virtual_stages: 2\n";
  if (c.replicas > 1) yaml += "replicas: " + std::to_string(c.replicas) + "\n";
  RunResult run;
  switch (c.via) {
    case Via::kInProc:
    case Via::kDelayed: run = RunInProcess(c, yaml); break;
    case Via::kGrpc: run = RunOverGrpcInProcess(c, yaml); break;
    case Via::kProcesses: run = RunOverProcesses(c, yaml, {}); break;
    case Via::kNccl:
    case Via::kGpuGrpc:
      (void)kNoTf32;
      at::globalContext().setAllowTF32CuBLAS(false);
      at::globalContext().setAllowTF32CuDNN(false);
      at::globalContext().setDeterministicCuDNN(true);
      at::globalContext().setBenchmarkCuDNN(false);
      yaml += c.via == Via::kNccl ? "transport: nccl\n" : "transport: grpc\n";
      run = RunOverProcesses(c, yaml, {"cuda:0", "cuda:1"});
      break;
  }
  ASSERT_EQ(run.status.state(), v1::JOB_STATE_SUCCEEDED) << run.status.error();
  const v1::LinkKind expected_link = c.via == Via::kNccl ? v1::LINK_NCCL
                                     : c.via == Via::kInProc || c.via == Via::kDelayed ? v1::LINK_IN_PROCESS
                                                                                        : v1::LINK_GRPC;
  if (c.stages > 1) EXPECT_EQ(run.status.stages(0).transport(), expected_link);
  ASSERT_EQ(run.status.stages_size(), c.stages * c.replicas);
  for (int i = 0; i < run.status.stages_size(); ++i) {  // the grid: replica k's stage s at k * P + s
    EXPECT_EQ(run.status.stages(i).replica(), i / c.stages);
    EXPECT_EQ(run.status.stages(i).index(), i % c.stages);
  }
  // Against a fresh reference where the job differs from the cached one's.
  const bool cached = !gpu && c.extra.empty();
  const cli::ReferenceResult ref = cached ? CachedReference(c.model) : Reference(yaml, gpu ? "cuda:0" : "cpu");
  ExpectMatchesReference(run.status, run.parameters, ref);
  if (ref.status.has_eval()) {
    EXPECT_NEAR(run.status.eval_accuracy(), ref.status.eval_accuracy(), 1e-9);
    // The mean test loss, gathered from the last stage's eval batches, equals
    // the reference's over whole batches.
    EXPECT_GT(ref.status.eval_loss(), 0);
    EXPECT_NEAR(run.status.eval_loss(), ref.status.eval_loss(), testing::kAtol + testing::kRtol * ref.status.eval_loss());
  }
  // Activation memory: GPipe holds every micro-batch, 1F1B at most P - s,
  // ZB-H1 keeps some longer for their deferred weight passes.
  if (gpu) {
    const int graphed = c.extra.find("cuda_graphs: true") != std::string::npos ? 19 : 0;
    for (const auto& stage : run.status.stages()) EXPECT_EQ(stage.graphed_steps(), graphed) << stage.index();
    return;
  }
  if (c.schedule == "interleaved") return;
  if (c.schedule == "zbv") {  // two chunks a stage, each holding at most every micro-batch
    for (const auto& stage : run.status.stages()) EXPECT_LE(stage.peak_activations(), 2 * c.micro_batches);
    return;
  }
  for (int i = 0; i < run.status.stages_size(); ++i) {
    const int s = run.status.stages(i).index();
    int64_t bound = c.micro_batches;
    if (c.schedule == "1f1b") bound = std::min(c.micro_batches, c.stages - s);
    if (c.schedule == "zero-bubble") {
      // A weight pass run while the stage waits for a frame frees its
      // micro-batch sooner than the list's place for it: at most the list's
      // bound, at least 1F1B's (forwards and backwards keep their order).
      const int64_t peak = run.status.stages(i).peak_activations();
      EXPECT_LE(peak, MostHeld(v1::SCHEDULE_ZERO_BUBBLE, s, c.stages, c.micro_batches)) << "stage " << s;
      EXPECT_GE(peak, std::min(c.micro_batches, c.stages - s)) << "stage " << s;
      continue;
    }
    EXPECT_EQ(run.status.stages(i).peak_activations(), bound) << "stage " << s;
  }
}

std::string Name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  std::string name = c.schedule == "1f1b" ? "1F1B" : c.schedule == "zero-bubble" ? "ZeroBubble" :
                     c.schedule == "interleaved" ? "Interleaved" : c.schedule == "zbv" ? "Zbv" : "GPipe";
  name = std::string(ViaName(c.via)) + "_" + c.model + "_" + std::to_string(c.stages) + "stages_" +
         std::to_string(c.micro_batches) + "mb_" + name;
  if (c.extra.find("eval: true") != std::string::npos) name += "_eval";
  if (c.extra.find("cuda_graphs: true") != std::string::npos) name += "_graphs";
  if (c.extra.find("nccl_headers: grpc") != std::string::npos) name += "_grpc_headers";
  if (c.extra.find("memory_format: channels_last") != std::string::npos) name += "_channels_last";
  if (c.extra.find("bucket_cap_mb") != std::string::npos) name += "_buckets";
  if (c.replicas > 1) name += "_" + std::to_string(c.replicas) + "replicas";
  return name;
}

// Every (model, stages, micro-batches, schedule) of `combos` over `via`.
std::vector<Case> Over(Via via, const std::string& model, std::vector<int> stages, std::vector<int> mbs,
                       std::vector<std::string> schedules, const std::string& extra = "") {
  std::vector<Case> out;
  for (int p : stages)
    for (int m : mbs)
      for (const std::string& s : schedules) out.push_back(Case{via, model, p, m, s, extra});
  return out;
}
std::vector<Case> Join(std::vector<std::vector<Case>> parts) {
  std::vector<Case> out;
  for (auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

const std::vector<std::string> kPlain = {"gpipe", "1f1b", "zero-bubble"};
const std::vector<std::string> kAll = {"gpipe", "1f1b", "interleaved", "zero-bubble", "zbv"};

// In-process, in-memory: the wide grid (every model, stage count and
// micro-batch count); interleaved needs micro-batches a multiple of the stages.
INSTANTIATE_TEST_SUITE_P(InProc, PipelineEquality,
                         ::testing::ValuesIn(Join({
                             Over(Via::kInProc, "toy", {1, 2, 3}, {1, 4, 8}, kPlain),
                             Over(Via::kInProc, "convnet", {1, 2, 4}, {1, 4, 8}, kPlain),
                             Over(Via::kInProc, "convnet", {1, 2, 4}, {4, 8}, {"interleaved"}),
                             Over(Via::kInProc, "convnet", {2, 4}, {3, 8}, {"zbv"}),
                             // The GPT decoder (7 layers here) with the schedules a 1.34 B model would use.
                             Over(Via::kInProc, "gpt", {1, 2, 3}, {1, 4}, {"1f1b", "zero-bubble"}),
                             Over(Via::kInProc, "gpt", {2}, {4}, {"interleaved"}),
                             Over(Via::kInProc, "gpt", {3}, {4}, {"zbv"}),
                         })),
                         Name);
// Tensors arriving late and out of order (timing_noise_test draws 100 random runs).
INSTANTIATE_TEST_SUITE_P(Delayed, PipelineEquality,
                         ::testing::ValuesIn(Join({
                             Over(Via::kDelayed, "toy", {3}, {4}, kPlain),
                             Over(Via::kDelayed, "convnet", {2}, {4}, kAll),
                         })),
                         Name);
// The real gRPC links (chunked streams into StageData services), in-process.
INSTANTIATE_TEST_SUITE_P(Grpc, PipelineEquality,
                         ::testing::ValuesIn(Join({
                             Over(Via::kGrpc, "toy", {3}, {4}, kPlain),
                             Over(Via::kGrpc, "convnet", {2}, {4}, kAll),
                             // Activations and gradients cross as channels-last bytes (tensor_payload.h).
                             Over(Via::kGrpc, "convnet", {2}, {4}, {"1f1b"}, "memory_format: channels_last\n"),
                         })),
                         Name);
// Stage server processes (was process_test's Processes and ProcessSchedules).
INSTANTIATE_TEST_SUITE_P(Processes, PipelineEquality,
                         ::testing::ValuesIn(Join({
                             Over(Via::kProcesses, "toy", {3}, {4}, {"1f1b"}),
                             Over(Via::kProcesses, "convnet", {4}, {8}, kAll, "eval: true\n"),
                         })),
                         Name);
// Data parallel x pipeline parallel (docs/parallelism.md): R copies of the
// pipeline, each on half of every batch, their gradients all-reduced through
// c10d's Gloo group, equal the single-process run on the whole batch.
std::vector<Case> Replicated(Via via, std::vector<int> stages, std::vector<std::string> schedules, int mbs = 4) {
  std::vector<Case> out;
  for (int p : stages)
    for (const std::string& s : schedules) out.push_back(Case{via, "convnet", p, mbs, s, "", 2});
  return out;
}
INSTANTIATE_TEST_SUITE_P(Replicas, PipelineEquality,
                         ::testing::ValuesIn(Join({
                             Replicated(Via::kInProc, {1, 2}, {"gpipe", "1f1b"}),
                             Replicated(Via::kInProc, {2}, {"interleaved", "zero-bubble", "zbv"}),
                             {Case{Via::kInProc, "toy", 2, 2, "1f1b", "", 2}},
                             // Channels-last gradients all-reduced (flattened in NCHW order, copied back).
                             {Case{Via::kInProc, "convnet", 2, 4, "1f1b", "memory_format: channels_last\n", 2}},
                             {Case{Via::kInProc, "gpt", 2, 2, "1f1b", "", 2}},
                             // Buckets of about 1 KiB: several per stage, each all-reduced during
                             // the last backward (weight) pass of its chunk, in bucket order.
                             {Case{Via::kInProc, "convnet", 2, 4, "interleaved", "bucket_cap_mb: 0.001\n", 2},
                              Case{Via::kInProc, "convnet", 2, 4, "zero-bubble", "bucket_cap_mb: 0.001\n", 2},
                              Case{Via::kInProc, "gpt", 2, 2, "1f1b", "bucket_cap_mb: 0.001\n", 2}},
                             Replicated(Via::kGrpc, {2}, {"1f1b"}),
                             Replicated(Via::kProcesses, {2}, {"gpipe"}),
                         })),
                         Name);
// Two GPUs (gpu_test's GpuLinks cases): NCCL, and gRPC through pinned staging;
// skipped without two.
INSTANTIATE_TEST_SUITE_P(Nccl, PipelineEquality,
                         ::testing::Values(Case{Via::kNccl, "gpt", 2, 4, "1f1b"},
                                           Case{Via::kNccl, "gpt", 2, 8, "interleaved"},
                                           Case{Via::kNccl, "gpt", 2, 8, "zero-bubble"},
                                           Case{Via::kNccl, "gpt", 2, 8, "zbv"},
                                           Case{Via::kNccl, "gpt", 2, 4, "1f1b", "cuda_graphs: true\n"},
                                           Case{Via::kNccl, "gpt", 2, 4, "1f1b", "nccl_headers: grpc\n"},
                                           Case{Via::kGpuGrpc, "gpt", 2, 4, "1f1b"},
                                           Case{Via::kGpuGrpc, "gpt", 2, 4, "gpipe", "cuda_graphs: true\n"}),
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

// Replicas of a bf16 pipeline through Gloo (no bfloat16 of its own: the sums
// go through float), ZeRO-1's parameters sent back bit for bit: the bf16
// reference's training, as above. Before, every step failed with Gloo's
// "Invalid scalar type" and the job recovered until it gave up.
TEST(Equality, Bf16ReplicasWithZeroOneTrainCloseToTheBf16Reference) {
  if (!ReplicaGroupsAvailable()) GTEST_SKIP() << "built without c10d's Gloo group";
  at::set_num_threads(1);
  const std::string base = kModels.at("gpt") + "precision: bf16\n";
  InProcessCluster cluster(4);
  auto coordinator = cluster.StartCoordinator();
  v1::JobStatus run = RunToEnd(*coordinator, base + "partition: {stages: 2}\nmicro_batches: 2\nschedule: 1f1b\n"
                                                    "replicas: 2\nzero: 1\n");
  ASSERT_EQ(run.state(), v1::JOB_STATE_SUCCEEDED) << run.error();
  EXPECT_EQ(run.recoveries(), 0);
  cli::ReferenceResult ref = Reference(base);
  ASSERT_EQ(run.losses_size(), ref.status.losses_size());
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

// memory_format: channels_last on the CPU (auto keeps NCHW there): the
// ConvNet's pipeline and reference equal the contiguous reference. ResNet50's
// two stages (BatchNorm, downsampling, activations crossing channels-last)
// equal the channels-last reference: against the contiguous one its rounding
// differences (1e-6 after the first layers) grow through 16 blocks to 3e-2
// where layer4's BatchNorm normalises over 4 samples of 1x1 pixels.
TEST(Equality, ChannelsLastEqualsContiguousOnTheCpu) {
  at::set_num_threads(1);
  const std::string cl = "memory_format: channels_last\n";
  const cli::ReferenceResult reference_cl = Reference(kModels.at("convnet") + cl);
  ExpectMatchesReference(reference_cl.status, reference_cl.parameters, CachedReference("convnet"));
  InProcessCluster cluster(2);
  auto coordinator = cluster.StartCoordinator();
  v1::JobStatus run =
      RunToEnd(*coordinator, kModels.at("convnet") + cl + "partition: {stages: 2}\nmicro_batches: 4\nschedule: 1f1b\n");
  ExpectMatchesReference(run, cluster.Parameters(run.job_id(), 2), CachedReference("convnet"));
  const std::string resnet =
      "model: {name: resnet50, image_size: 32, num_classes: 10}\ndata: {name: synthetic, train_samples: 8}\n"
      "batch_size: 4\nsteps: 2\noptimizer: {name: sgd, lr: 0.001, momentum: 0.9}\nloss: mse\npartition: {stages: 2}\n";
  run = RunToEnd(*coordinator, resnet + cl);
  ExpectMatchesReference(run, cluster.Parameters(run.job_id(), 2), Reference(resnet + cl));
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

// The summary's memory per stage: parameters and their gradients in fp32,
// Adam's two moments per parameter, the activations held at the peak.
TEST(Equality, EachStageReportsWhatItsMemoryHolds) {
  at::set_num_threads(1);
  InProcessCluster cluster(2);
  auto coordinator = cluster.StartCoordinator();
  const v1::JobStatus run = RunToEnd(*coordinator,
                                     "model: {name: mlp, input_dim: 32, hidden: [64]}\npartition: {stages: 2}\n"
                                     "optimizer: adam\nsteps: 2\nmicro_batches: 2\n");
  ASSERT_EQ(run.state(), v1::JOB_STATE_SUCCEEDED) << run.error();
  ASSERT_EQ(run.stages_size(), 2);
  for (const auto& st : run.stages()) {
    EXPECT_EQ(st.parameter_bytes(), 4 * st.num_parameters()) << st.index();
    EXPECT_EQ(st.gradient_bytes(), st.parameter_bytes()) << st.index();
    EXPECT_EQ(st.optimizer_state_bytes(), 2 * st.parameter_bytes()) << st.index();  // exp_avg, exp_avg_sq
    EXPECT_GT(st.peak_activation_bytes(), 0) << st.index();
    EXPECT_EQ(st.device_peak_bytes(), 0) << st.index();  // CUDA only
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
  EXPECT_NEAR(run.eval_loss(), ref.status.eval_loss(), 1e-4 * ref.status.eval_loss());
}

// The steady clock counts the steps the device finished between its two ends
// (common/steady_rate.h). The reference reads each step's loss after the next
// step is launched on CUDA; here on the CPU through defer_reads, whose
// arithmetic is the same as reading at once. A 6-step run with 2 warm-up steps
// counts 4: the old clock counted 4 over the time of 3 (1.33x).
TEST(Clock, AReadOneStepLateCountsOnlyTheStepsTheDeviceFinished) {
  at::set_num_threads(1);
  std::string yaml = kModels.at("toy");
  yaml.replace(yaml.find("steps: 20"), 9, "steps: 6");
  auto spec = ParseJobYaml(yaml);
  ASSERT_TRUE(spec.ok()) << spec.status();
  cli::ReferenceOptions at_once, late;
  late.defer_reads = true;
  auto a = cli::TrainReference(*spec, at_once);
  auto b = cli::TrainReference(*spec, late);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(a->status.losses_size(), 6);
  ASSERT_EQ(b->status.losses_size(), 6);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(a->status.losses(i), b->status.losses(i)) << "step " << i + 1;
  EXPECT_EQ(a->status.param_digest(), b->status.param_digest());
  for (const auto* s : {&a->status, &b->status}) {
    EXPECT_EQ(s->steady_steps(), 4);
    EXPECT_GT(s->steady_seconds(), 0);
    EXPECT_DOUBLE_EQ(s->steady_samples_per_second(), 4 * 16 / s->steady_seconds());
    ASSERT_EQ(s->step_seconds_size(), 6);  // each step's time, as each was read
    for (double t : s->step_seconds()) EXPECT_GT(t, 0);
  }
  // Read at once, the steady steps' times add up to the steady clock.
  EXPECT_NEAR(a->status.step_seconds(2) + a->status.step_seconds(3) + a->status.step_seconds(4) +
                  a->status.step_seconds(5),
              a->status.steady_seconds(), 1e-9);
  // A pipelined job's stages reply once their device finished the step.
  InProcessCluster cluster(2);
  auto coordinator = cluster.StartCoordinator();
  v1::JobStatus run = RunToEnd(*coordinator, yaml + "partition: {stages: 2}\nmicro_batches: 2\n");
  ASSERT_EQ(run.state(), v1::JOB_STATE_SUCCEEDED) << run.error();
  EXPECT_EQ(run.steady_steps(), 4);
  EXPECT_DOUBLE_EQ(run.steady_samples_per_second(), 4 * 16 / run.steady_seconds());
  ASSERT_EQ(run.step_seconds_size(), 6);
  EXPECT_NEAR(run.step_seconds(2) + run.step_seconds(3) + run.step_seconds(4) + run.step_seconds(5),
              run.steady_seconds(), 1e-9);
}

// The 2 x 2 MLP job of the Zero tests, with `recipe` (optimizer and the
// like), run with zero 0 and with zero 1 on clusters of their own.
constexpr char kZeroJob[] =
    "model: {name: mlp, input_dim: 32, hidden: [64, 64, 32]}\npartition: {stages: 2}\nreplicas: 2\n"
    "data: {name: synthetic, train_samples: 512}\nbatch_size: 32\nmicro_batches: 2\nsteps: 10\n";

std::array<v1::JobStatus, 2> RunUnshardedAndSharded(const std::string& recipe) {
  std::array<v1::JobStatus, 2> runs;
  for (int zero : {0, 1}) {
    InProcessCluster cluster(4);
    auto coordinator = cluster.StartCoordinator();
    runs[zero] = RunToEnd(*coordinator, kZeroJob + recipe + "zero: " + std::to_string(zero) + "\n");
    EXPECT_EQ(runs[zero].state(), v1::JOB_STATE_SUCCEEDED) << "zero " << zero << ": " << runs[zero].error();
  }
  return runs;
}

// ZeRO-1 (zero: 1) on a 2 x 2 grid with AdamW: each replica updates its half
// of every gradient bucket's elements (buckets of 8 KiB here: several a
// stage, parameters cut across slices and buckets, biases without weight
// decay) with its half of the moments, and the copies all-gather them; the
// run equals the unsharded one bit for bit (losses and digest), and each
// stage's optimizer state is split between its two copies (the memory
// report's shares add up to the unsharded state).
TEST(Zero, ShardingTheOptimizerOverTwoReplicasTrainsAsWithoutAndSplitsItsState) {
  if (!ReplicaGroupsAvailable()) GTEST_SKIP() << "built without c10d's Gloo group";
  const auto runs = RunUnshardedAndSharded(
      "optimizer: {name: adamw, lr: 0.001, weight_decay: 0.1, no_decay: [bias]}\nbucket_cap_mb: 0.0078125\n");
  ASSERT_EQ(runs[0].stages_size(), 4);
  ASSERT_EQ(runs[1].stages_size(), 4);
  EXPECT_EQ(runs[1].param_digest(), runs[0].param_digest());
  ASSERT_EQ(runs[1].losses_size(), runs[0].losses_size());
  for (int i = 0; i < runs[0].losses_size(); ++i) EXPECT_EQ(runs[1].losses(i), runs[0].losses(i)) << "step " << i + 1;
  for (int s = 0; s < 2; ++s) {  // replica k's stage s is report k * 2 + s
    const int64_t whole = runs[0].stages(s).optimizer_state_bytes();
    const int64_t r0 = runs[1].stages(s).optimizer_state_bytes(), r1 = runs[1].stages(s + 2).optimizer_state_bytes();
    EXPECT_GT(whole, 0);
    EXPECT_EQ(r0 + r1, whole) << "stage " << s;
    EXPECT_LT(r0, whole) << "stage " << s;
    EXPECT_LT(r1, whole) << "stage " << s;
  }
}

// With clipping by the global gradient norm: each copy's squared norm of its
// slices, summed over the copies (and the coordinator combining the
// stages'), is the unsharded run's norm to float rounding (the same sums in
// another order), so the clipping and the losses are the unsharded run's.
TEST(Zero, ClippingByTheGlobalNormUnderShardingTrainsAsWithout) {
  if (!ReplicaGroupsAvailable()) GTEST_SKIP() << "built without c10d's Gloo group";
  const auto runs = RunUnshardedAndSharded("optimizer: {name: sgd, lr: 0.5}\nclip_grad_norm: 0.05\n");
  for (const v1::JobStatus& run : runs) {
    ASSERT_EQ(run.losses_size(), 10);
    ASSERT_EQ(run.grad_norms_size(), 10);
  }
  EXPECT_GT(runs[0].grad_norms(0), 0.05) << "the test needs a norm that clipping cuts";
  for (int i = 0; i < 10; ++i) {
    EXPECT_NEAR(runs[1].grad_norms(i), runs[0].grad_norms(i), 1e-6 * runs[0].grad_norms(i)) << "step " << i + 1;
    EXPECT_NEAR(runs[1].losses(i), runs[0].losses(i), 1e-6 * std::abs(runs[0].losses(i))) << "step " << i + 1;
  }
}

}  // namespace
}  // namespace conveyor
