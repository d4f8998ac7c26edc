#include "plan/job_spec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <limits>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "common/files.h"
#include "plan/job_keys.h"
#include "plan/model_catalog.h"
#include "plan/schedule.h"
#include "tests/support/test_util.h"

namespace conveyor {
namespace {

using ::testing::HasSubstr;

const char* kFull = R"(
name: fashion-convnet
model: {name: convnet, num_classes: 10}
partition: {stages: 4}
data: {name: fashion-mnist, path: /usr/share/datasets/fashion-mnist}
batch_size: 64
micro_batches: 8
schedule: gpipe
optimizer: {name: adam, lr: 0.001}
loss: cross_entropy
epochs: 3
eval: true
seed: 0
)";

Status ParseError(const std::string& yaml) { return ParseJobYaml(yaml).status(); }

TEST(JobSpec, ParsesTheDocumentedExample) {
  auto spec = ParseJobYaml(kFull);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name(), "fashion-convnet");
  EXPECT_EQ(spec->model().kind(), v1::MODEL_CONVNET);
  EXPECT_EQ(spec->partition().stages(), 4);
  EXPECT_EQ(spec->data().kind(), v1::DATA_FASHION_MNIST);
  EXPECT_EQ(spec->batch_size(), 64);
  EXPECT_EQ(spec->micro_batches(), 8);
  EXPECT_EQ(spec->schedule(), v1::SCHEDULE_GPIPE);
  EXPECT_EQ(spec->optimizer().kind(), v1::OPTIMIZER_ADAM);
  EXPECT_DOUBLE_EQ(spec->optimizer().lr(), 0.001);
  EXPECT_EQ(spec->epochs(), 3);
  EXPECT_TRUE(spec->eval());
}

TEST(JobSpec, FillsDefaults) {
  auto spec = ParseJobYaml("model: toy");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->partition().stages(), 1);
  EXPECT_EQ(spec->data().kind(), v1::DATA_SYNTHETIC);
  EXPECT_EQ(spec->batch_size(), 32);
  EXPECT_EQ(spec->micro_batches(), 1);
  EXPECT_EQ(spec->schedule(), v1::SCHEDULE_GPIPE);
  EXPECT_EQ(spec->optimizer().kind(), v1::OPTIMIZER_SGD);
  EXPECT_EQ(spec->loss(), v1::LOSS_CROSS_ENTROPY);
  EXPECT_EQ(spec->epochs(), 1);
  EXPECT_DOUBLE_EQ(spec->stage_timeout_s(), 10);
  EXPECT_EQ(spec->checkpoint_every(), 0);
  EXPECT_EQ(spec->keep_checkpoints(), 3);
  EXPECT_EQ(spec->nccl_ctas(), kDefaultNcclCtas);
  EXPECT_EQ(spec->matmul_sm_carveout(), v1::SM_CARVEOUT_OFF);
  EXPECT_FALSE(spec->has_cuda_graphs());  // auto
  EXPECT_EQ(spec->nccl_headers(), v1::NCCL_HEADERS_SHM);  // shared memory where both ends have it
  EXPECT_DOUBLE_EQ(spec->recovery_timeout_s(), 120);
}

TEST(JobSpec, NcclHeadersMayStayOnTheGrpcStream) {
  auto spec = ParseJobYaml("model: toy\nnccl_headers: grpc\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->nccl_headers(), v1::NCCL_HEADERS_GRPC);
  spec = ParseJobYaml("model: toy\nnccl_headers: shm\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->nccl_headers(), v1::NCCL_HEADERS_SHM);
  EXPECT_THAT(ParseJobYaml("model: toy\nnccl_headers: tcp\n").status().message(),
              HasSubstr("nccl_headers: unknown value 'tcp' (one of: shm, grpc)"));
}

// NCCL's own CTA count (0) deadlocked NCCL links beside CUDA graph replays
// (W1 on two H100s): under cuda_graphs it becomes the default; a count the
// job gives stays.
TEST(JobSpec, NcclCtasZeroIsBoundedUnderCudaGraphs) {
  for (const auto& [yaml, want] : std::vector<std::pair<std::string, int>>{
           {"model: toy\nnccl_ctas: 0\ncuda_graphs: false\n", 0},
           {"model: toy\nnccl_ctas: 0\npartition: {stages: 2}\nmicro_batches: 4\nschedule: 1f1b\n", 0},
           {"model: toy\nnccl_ctas: 0\n", kDefaultNcclCtas},  // auto: graphs on one stage
           {"model: toy\nnccl_ctas: 0\ncuda_graphs: true\n", kDefaultNcclCtas},
           {"model: toy\nnccl_ctas: 8\ncuda_graphs: true\n", 8},
           {"model: toy\ncuda_graphs: true\n", kDefaultNcclCtas}}) {
    auto spec = ParseJobYaml(yaml);
    ASSERT_TRUE(spec.ok()) << spec.status();
    EXPECT_EQ(NcclCtas(*spec), want) << yaml;
  }
}

// cuda_graphs left out (auto): on where graphs can work and hold no more
// memory than the schedule does, off elsewhere with the reason; given, as
// given.
TEST(JobSpec, CudaGraphsAutoIsOnWhereGraphsHoldNoMoreThanTheSchedule) {
  struct Case {
    std::string yaml;
    bool reference, on;
    std::string why;
  };
  const std::string pipe = "partition: {stages: 2}\nmicro_batches: 4\n";
  for (const Case& c : std::vector<Case>{
           {"model: toy\n", false, true, ""},
           {"model: toy\n" + pipe + "schedule: gpipe\n", false, true, ""},
           {"model: toy\n" + pipe + "schedule: 1f1b\n", false, false, "every micro-batch's activations"},
           {"model: toy\n" + pipe + "schedule: 1f1b\n", true, true, ""},
           {"model: toy\npartition: {stages: 2}\nschedule: 1f1b\n", false, true, ""},  // one micro-batch
           {"model: toy\n" + pipe + "schedule: zero-bubble\n", false, false, "zero-bubble"},
           {"model: toy\nprecision: bf16-mixed\n", true, false, "mixed precision"},
           {"model: toy\nrecompute: true\n", true, false, "recompute"},
           {"model: toy\nreplicas: 2\n", false, true, ""},  // replicas of one stage: reduced after the replays
           {"model: toy\nreplicas: 2\n" + pipe + "schedule: gpipe\n", false, false, "replicas of a pipeline"},
           {"model: toy\nreplicas: 2\n", true, true, ""},
           {"model: toy\n" + pipe + "schedule: 1f1b\ncuda_graphs: true\n", false, true, ""},
           {"model: toy\ncuda_graphs: false\n", true, false, "cuda_graphs: false"},
           {"model: toy\ncuda_graphs: auto\n", true, true, ""}}) {
    auto spec = ParseJobYaml(c.yaml);
    ASSERT_TRUE(spec.ok()) << spec.status();
    const GraphsChoice got = CudaGraphsFor(*spec, c.reference);
    EXPECT_EQ(got.on, c.on) << c.yaml << (c.reference ? " (reference)" : "");
    EXPECT_THAT(got.why_off, HasSubstr(c.why)) << c.yaml;
    if (c.on) EXPECT_EQ(got.why_off, "") << c.yaml;
  }
  EXPECT_FALSE(ParseJobYaml("model: toy\ncuda_graphs: auto\n")->has_cuda_graphs());
  EXPECT_THAT(ParseJobYaml("model: toy\ncuda_graphs: 1\n").status().message(),
              HasSubstr("cuda_graphs: expected auto, true or false, got the integer 1"));
}

// An evaluation needs a test split: without one it reported 0% accuracy and
// perplexity 1 as if measured.
TEST(JobSpec, EvalWithoutTestDataIsRefusedNamingTheKey) {
  EXPECT_THAT(ParseJobYaml("model: toy\ndata: {name: synthetic, test_samples: 0}\neval: true\n").status().message(),
              HasSubstr("eval: true, but data.test_samples is 0"));
  EXPECT_THAT(ParseJobYaml("model: toy\ndata: {format: tensors, train: t.pt}\neval: true\n").status().message(),
              HasSubstr("eval: true, but data.test names no test file"));
  EXPECT_TRUE(ParseJobYaml("model: toy\ndata: {name: synthetic, test_samples: 0}\n").ok());
  EXPECT_TRUE(ParseJobYaml("model: toy\ndata: {format: tensors, train: t.pt, test: u.pt}\neval: true\n").ok());
}

TEST(JobSpec, UnknownKeysAreNamed) {
  Status st = ParseError("model: toy\nbatchsize: 3\n");
  EXPECT_TRUE(absl::IsInvalidArgument(st));
  EXPECT_THAT(std::string(st.message()), HasSubstr("batchsize: unknown key"));
  st = ParseError("model: {name: toy, depth: 3}\n");
  EXPECT_THAT(std::string(st.message()), HasSubstr("model.depth: unknown key"));
  st = ParseError("model: {name: toy, width: 3}\n");
  EXPECT_THAT(std::string(st.message()), HasSubstr("model.width: only with name: gpt"));
  st = ParseError("model: toy\noptimizer: {name: sgd, momentun: 0.9}\n");
  EXPECT_THAT(std::string(st.message()), HasSubstr("optimizer.momentun: unknown key (did you mean momentum?)"));
  EXPECT_THAT(std::string(ParseError("model: toy\nbatchsize: 3\n").message()),
              HasSubstr("batchsize: unknown key (did you mean batch_size?)"));
  EXPECT_THAT(std::string(ParseError("model: toy\nmicro_bathces: 3\n").message()),
              HasSubstr("(did you mean micro_batches?)"));
  // Nothing near: the keys known there instead.
  EXPECT_THAT(std::string(ParseError("model: toy\nzzzzzz: 3\n").message()), HasSubstr("unknown key (known here: "));
}

TEST(JobSpec, WrongTypesAreNamed) {
  Status st = ParseError("model: toy\nbatch_size: lots\n");
  EXPECT_TRUE(absl::IsInvalidArgument(st));
  EXPECT_THAT(std::string(st.message()), HasSubstr("batch_size: expected an integer, got 'lots'"));
  st = ParseError("model: toy\noptimizer: {name: sgd, lr: fast}\n");
  EXPECT_THAT(std::string(st.message()), HasSubstr("optimizer.lr: expected a number"));
  st = ParseError("model: toy\neval: maybe\n");
  EXPECT_THAT(std::string(st.message()), HasSubstr("eval: expected true or false"));
  st = ParseError("model: toy\npartition: {boundaries: [1, x]}\n");
  EXPECT_THAT(std::string(st.message()), HasSubstr("partition.boundaries: item 1"));
}

// Each bad value and the words its INVALID_ARGUMENT must carry: data, one row a
// mistake, so the test below stays a loop.
struct BadValueCase {
  const char* yaml;
  const char* message;
};
const BadValueCase kBadValueCases[] = {
    {"model: toy\nbatch_size: 4\nmicro_batches: 8\n", "micro_batches: 8 is larger than batch_size 4"},
    {"model: toy\nbatch_size: 4\nsplit_size: 5\n", "split_size: 5 is larger than batch_size 4"},
    {"model: toy\nmicro_batches: 2\nsplit_size: 2\n", "not both"},
    {"model: toy\nbatch_size: 10\nmicro_batches: 1\nreplicas: 4\n",
     "replicas: batch_size 10 does not split evenly over 4 replicas"},
    {"model: toy\nbatch_size: 8\nmicro_batches: 8\nreplicas: 2\n",
     "each of the 2 replicas gets 4 samples of a batch, fewer than micro_batches 8"},
    {"model: toy\nreplicas: 0\n", "replicas"},
    {"model: toy\npartition: {stages: 4}\n", "4 stages but the model has only 3 layers"},
    {"model: toy\npartition: {boundaries: [2, 1]}\n", "partition.boundaries: must increase"},
    {"model: toy\npartition: {stages: 3, boundaries: [1]}\n", "3 chunks need 2 boundaries"},
    {"model: toy\nschedule: fast\n", "schedule: unknown value 'fast' (one of: gpipe, 1f1b, interleaved, zero-bubble, zbv)"},
    {"model: convnet\npartition: {stages: 2}\nschedule: interleaved\nmicro_batches: 4\n", "needs 2 or more"},
    {"model: convnet\npartition: {stages: 2}\nschedule: interleaved\nvirtual_stages: 2\nmicro_batches: 3\n",
     "multiple of the stages (2), got 3"},
    {"model: convnet\nvirtual_stages: 2\n", "only the interleaved and zbv schedules"},
    {"model: convnet\npartition: {stages: 2}\nschedule: zbv\nvirtual_stages: 3\n", "zbv schedule places two chunks"},
    {"model: toy\npartition: {stages: 2}\nschedule: zbv\n", "2 stages of 2 chunks but the model has only 3 layers"},
    {"model: toy\ncuda_graphs: true\nschedule: zbv\n", "cuda_graphs: cannot be combined with the zbv"},
    {"model: toy\npartition: {stages: 2}\nschedule: interleaved\nvirtual_stages: 2\nmicro_batches: 2\n",
     "2 stages of 2 chunks but the model has only 3 layers"},
    {"model: toy\nrecompute: [3]\n", "recompute: stage 3 is not one of the job's stages"},
    {"model: toy\nrecompute: sometimes\n", "recompute: expected true, false or a list"},
    {"model: resnet9\n", "model.name: unknown value 'resnet9'"},
    {"batch_size: 3\n", "model: missing"},
    {"model: toy\nepochs: 1\nsteps: 3\n", "epochs and steps"},
    {"model: toy\noptimizer: {name: sgd, lr: -1}\n", "optimizer.lr: must be more than 0 and at most 1000, got -1"},
    {"model: toy\nbatch_size: 0\n", "batch_size: must be between"},
    {"model: toy\ndata: fashion-mnist\n", "use convnet or mlp"},
    {"model: toy\nstage_timeout: 0\n", "stage_timeout"},
    {"model: toy\ncheckpoint_every: -1\n", "checkpoint_every"},
    {"model: toy\nkeep_checkpoints: 1\n", "keep_checkpoints"},
    {"model: toy\nnccl_ctas: -1\n", "nccl_ctas"},
    {"model: toy\nnccl_ctas: many\n", "nccl_ctas"},
    {"model: toy\nrecovery_timeout: -5\n", "recovery_timeout"},
    {"model: toy\npartition: {stages: 2, link_gbps: 10}\n", "partition.link_gbps: only with balance: time"},
    {"model: toy\npartition: {stages: 2, balance: time, link_gbps: -1}\n", "partition.link_gbps"},
    {"model: toy\ncheckpoint_every: 10\ncommit_steps: true\n", "commit_steps: keeps the other replicas whole when "
     "one is lost: it needs replicas of 2 or more"},
    {"model: toy\nbatch_size: 8\nreplicas: 2\nzero: 1\ncommit_steps: true\n",
     "commit_steps: cannot keep a zero 1 job's state when a replica is lost"},
    {"model: toy\nprofile_step: -1\n", "profile_step"},
    {"model: toy\nsteps: 5\nprofile_step: 6\n", "profile_step: 6 is past the job's last step (5)"},
    {"model: toy\nmatmul_sm_carveout: some\n", "matmul_sm_carveout: expected auto, off or a number"},
    {"model: toy\nmatmul_sm_carveout: 65\n", "matmul_sm_carveout"},
    {"model: toy\ncuda_graphs: maybe\n", "cuda_graphs"},
    {"model: toy\nnccl_headers: tcp\n", "nccl_headers: unknown value 'tcp' (one of: shm, grpc)"},
    {"model: toy\ncuda_graphs: true\nrecompute: true\n", "cuda_graphs: cannot be combined with recompute"},
    {"model: toy\ncuda_graphs: true\nrecompute: [0]\n", "cuda_graphs: cannot be combined with recompute"},
    {"model: toy\ncuda_graphs: true\nschedule: zero-bubble\n", "cuda_graphs: cannot be combined with the zero-bubble"},
    {"- just\n- a list\n", "expected a mapping"},
    {"model: {name: toy\n", "not valid YAML"},
};

TEST(JobSpec, BadValuesAreNamed) {
  for (const auto& c : kBadValueCases) {
    Status st = ParseError(c.yaml);
    EXPECT_TRUE(absl::IsInvalidArgument(st)) << c.yaml << " -> " << st;
    EXPECT_THAT(std::string(st.message()), HasSubstr(c.message)) << c.yaml;
  }
}

TEST(JobSpec, SchedulesAndRecompute) {
  auto spec = ParseJobYaml(
      "model: convnet\npartition: {stages: 2}\nschedule: interleaved\nvirtual_stages: 3\nmicro_batches: 4\n"
      "recompute: [1]\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->schedule(), v1::SCHEDULE_INTERLEAVED);
  EXPECT_EQ(spec->virtual_stages(), 3);
  EXPECT_FALSE(RecomputeOn(*spec, 0));
  EXPECT_TRUE(RecomputeOn(*spec, 1));
  auto ranges = PartitionLayers(*spec);
  ASSERT_TRUE(ranges.ok());
  EXPECT_EQ(ranges->size(), 6u);  // chunks: 2 stages x 3
  spec = ParseJobYaml("model: convnet\npartition: {stages: 2}\nschedule: zbv\nmicro_batches: 3\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->virtual_stages(), 2);  // zbv's V: two chunks a stage, any micro-batch count
  ASSERT_TRUE(PartitionLayers(*spec).ok());
  EXPECT_EQ(PartitionLayers(*spec)->size(), 4u);
  spec = ParseJobYaml("model: toy\nschedule: zero-bubble\nrecompute: true\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(RecomputeOn(*spec, 0));
}

TEST(JobSpec, MicroBatchSizes) {
  v1::JobSpec spec;
  spec.set_micro_batches(4);
  EXPECT_EQ(MicroBatchSizes(spec, 10), (std::vector<int64_t>{3, 3, 2, 2}));
  EXPECT_EQ(MicroBatchSizes(spec, 2), (std::vector<int64_t>{1, 1}));
  spec.set_micro_batches(0);
  spec.set_split_size(8);  // the seed's knob: samples per micro-batch
  EXPECT_EQ(MicroBatchSizes(spec, 20), (std::vector<int64_t>{8, 8, 4}));
  EXPECT_EQ(MicroBatchSizes(spec, 16), (std::vector<int64_t>{8, 8}));
}

TEST(JobSpec, MoreThan65536MicroBatchesAreRefused) {
  const Status st = ParseError("model: toy\nbatch_size: 502480\nsplit_size: 1\n");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), HasSubstr("with split_size 1 makes 502480 micro-batches, more than 65536: give fewer"));
  EXPECT_TRUE(ParseJobYaml("model: toy\nbatch_size: 502480\nsplit_size: 8\n").ok());
}

TEST(JobSpec, MicroBatchCountIsTheListsLengthWithoutTheList) {
  for (int64_t batch : {0, 1, 2, 7, 16, 20, 501}) {
    for (int64_t m : {1, 3, 4, 64}) {
      v1::JobSpec spec;
      spec.set_micro_batches(m);
      EXPECT_EQ(MicroBatchCount(spec, batch), static_cast<int64_t>(MicroBatchSizes(spec, batch).size())) << batch;
      spec.set_micro_batches(0);
      spec.set_split_size(m);
      EXPECT_EQ(MicroBatchCount(spec, batch), static_cast<int64_t>(MicroBatchSizes(spec, batch).size())) << batch;
    }
  }
}

TEST(ModelCatalog, BalancedBoundariesMinimiseTheCostliestRange) {
  EXPECT_EQ(BalancedBoundaries({1, 1, 1, 1}, 2), (std::vector<int>{2}));
  EXPECT_EQ(BalancedBoundaries({5, 1, 1, 1, 1, 1}, 2), (std::vector<int>{1}));
  EXPECT_EQ(BalancedBoundaries({1, 2, 3, 4, 5}, 3), (std::vector<int>{3, 4}));
  EXPECT_EQ(BalancedBoundaries({7, 7, 7}, 3), (std::vector<int>{1, 2}));
  // Against every cut of random costs into 3 ranges.
  std::mt19937 rng(5);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<double> costs(2 + rng() % 9);
    for (double& c : costs) c = static_cast<double>(rng() % 100);
    const int n = static_cast<int>(costs.size()), parts = std::min(3, n);
    auto cost_of = [&](const std::vector<int>& cuts) {
      std::vector<int> edges{0};
      edges.insert(edges.end(), cuts.begin(), cuts.end());
      edges.push_back(n);
      double worst = 0;
      for (std::size_t r = 0; r + 1 < edges.size(); ++r) {
        double sum = 0;
        for (int i = edges[r]; i < edges[r + 1]; ++i) sum += costs[i];
        worst = std::max(worst, sum);
      }
      return worst;
    };
    double best = std::numeric_limits<double>::infinity();
    for (int a = 1; a < n; ++a)
      for (int b = a + 1; b < n; ++b) best = std::min(best, cost_of(parts == 3 ? std::vector<int>{a, b} : std::vector<int>{a}));
    if (parts == 2)
      for (int a = 1; a < n; ++a) best = std::min(best, cost_of({a}));
    std::vector<int> cuts = BalancedBoundaries(costs, parts);
    ASSERT_EQ(static_cast<int>(cuts.size()), parts - 1);
    for (std::size_t i = 0; i < cuts.size(); ++i) EXPECT_GT(cuts[i], i == 0 ? 0 : cuts[i - 1]);
    EXPECT_EQ(cost_of(cuts), best) << "trial " << trial;
  }
}

// SimulateCut's step for a cut the search returned (which must simulate).
double SimulatedStep(const std::vector<double>& costs, const std::vector<int>& cuts, v1::ScheduleKind kind,
                     int stages, int m, int v) {
  auto t = SimulateCut(costs, cuts, kind, stages, m, v);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *t : 0;
}

// Against every cut of random costs: the best one (few cuts are searched
// exhaustively), so never slower than the even chunks' cut.
TEST(ModelCatalog, ScheduledBoundariesComeCloseToTheBestCut) {
  std::mt19937 rng(11);
  const v1::ScheduleKind kinds[] = {v1::SCHEDULE_INTERLEAVED, v1::SCHEDULE_1F1B, v1::SCHEDULE_GPIPE};
  for (int trial = 0; trial < 40; ++trial) {
    const v1::ScheduleKind kind = kinds[trial % 3];
    const int stages = 2 + static_cast<int>(rng() % 2), v = kind == v1::SCHEDULE_INTERLEAVED ? 2 : 1;
    const int parts = stages * v, m = stages * (1 + static_cast<int>(rng() % 4));
    std::vector<double> costs(static_cast<std::size_t>(parts + static_cast<int>(rng() % 6)));
    for (double& c : costs) c = static_cast<double>(1 + rng() % 50);
    const int n = static_cast<int>(costs.size());
    double best = std::numeric_limits<double>::infinity();
    std::vector<int> cuts(static_cast<std::size_t>(parts - 1));
    std::function<void(int, int)> all = [&](int c, int begin) {  // every cut
      if (c == parts - 1) {
        best = std::min(best, SimulatedStep(costs, cuts, kind, stages, m, v));
        return;
      }
      for (int end = begin + 1; end <= n - (parts - 1 - c); ++end) {
        cuts[static_cast<std::size_t>(c)] = end;
        all(c + 1, end);
      }
    };
    all(0, 0);
    std::vector<int> got = ScheduledBoundaries(costs, kind, stages, m, v);
    ASSERT_EQ(static_cast<int>(got.size()), parts - 1);
    for (std::size_t i = 0; i < got.size(); ++i) EXPECT_GT(got[i], i == 0 ? 0 : got[i - 1]);
    const double t = SimulatedStep(costs, got, kind, stages, m, v);
    EXPECT_LE(t, SimulatedStep(costs, BalancedBoundaries(costs, parts), kind, stages, m, v)) << "trial " << trial;
    EXPECT_DOUBLE_EQ(t, best) << "trial " << trial << " " << ScheduleName(kind);
  }
}

// Too many cuts to try them all (8 stages x 2 chunks over 60 layers):
// coordinate descent, never slower than the even chunks' cut.
TEST(ModelCatalog, ScheduledBoundariesOfManyChunks) {
  std::mt19937 rng(3);
  std::vector<double> costs(60);
  for (double& c : costs) c = static_cast<double>(1 + rng() % 20);
  std::vector<int> got = ScheduledBoundaries(costs, v1::SCHEDULE_INTERLEAVED, 8, 16, 2);
  ASSERT_EQ(got.size(), 15u);
  for (std::size_t i = 0; i < got.size(); ++i) EXPECT_GT(got[i], i == 0 ? 0 : got[i - 1]);
  EXPECT_LT(got.back(), 60);
  EXPECT_LE(SimulatedStep(costs, got, v1::SCHEDULE_INTERLEAVED, 8, 16, 2),
            SimulatedStep(costs, BalancedBoundaries(costs, 16), v1::SCHEDULE_INTERLEAVED, 8, 16, 2));
}

// partition.link_gbps: four equal layers whose first two outputs are large
// (a convolution's early maps) and last two small. Free transfers cut in the
// middle; over a slow link the cut moves to where little crosses, though the
// stages are then uneven.
TEST(ModelCatalog, ScheduledBoundariesOverASlowLinkCutWhereLittleCrosses) {
  const std::vector<double> costs{1, 1, 1, 1};
  EXPECT_EQ(ScheduledBoundaries(costs, v1::SCHEDULE_1F1B, 2, 4, 1), (std::vector<int>{2}));
  LinkCosts link;
  link.output_bytes = {1e8, 1e8, 1e3, 1e3};
  link.bytes_per_second = 1e9 / 8;  // 1 Gb/s: 0.8 s for the large outputs
  link.latency_s = 2e-4;
  EXPECT_EQ(ScheduledBoundaries(costs, v1::SCHEDULE_1F1B, 2, 4, 1, link), (std::vector<int>{3}));
  auto over_link = SimulateCut(costs, {2}, v1::SCHEDULE_1F1B, 2, 4, 1, link);
  auto free = SimulateCut(costs, {2}, v1::SCHEDULE_1F1B, 2, 4, 1);
  ASSERT_TRUE(over_link.ok() && free.ok());
  EXPECT_GT(*over_link, *free + 0.8);
}

// W2's shape (embedding, 24 blocks, norm, output layer at 1.3 blocks), two
// stages of two chunks: a cut whose step is shorter than the even chunks'
// (the first and last chunks, on the warm-up's and cool-down's path, come out
// lighter), with the stages' sums still near even.
TEST(ModelCatalog, ScheduledBoundariesOfW2Interleaved) {
  std::vector<double> costs{0.1};
  costs.insert(costs.end(), 24, 1.0);
  costs.push_back(0.05);
  costs.push_back(1.3);
  std::vector<int> cuts = ScheduledBoundaries(costs, v1::SCHEDULE_INTERLEAVED, 2, 8, 2);
  ASSERT_EQ(cuts.size(), 3u);
  EXPECT_LT(SimulatedStep(costs, cuts, v1::SCHEDULE_INTERLEAVED, 2, 8, 2),
            SimulatedStep(costs, BalancedBoundaries(costs, 4), v1::SCHEDULE_INTERLEAVED, 2, 8, 2));
  double stage[2] = {0, 0};
  for (std::size_t c = 0, begin = 0; c <= cuts.size(); ++c) {
    const std::size_t end = c < cuts.size() ? static_cast<std::size_t>(cuts[c]) : costs.size();
    stage[c % 2] += std::accumulate(costs.begin() + begin, costs.begin() + end, 0.0);
    begin = end;
  }
  EXPECT_NEAR(stage[0], stage[1], 0.1 * stage[1]) << ::testing::PrintToString(cuts);
}

TEST(JobSpec, PartitionBalance) {
  auto spec = ParseJobYaml("model: convnet\npartition: {stages: 2, balance: params}\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->partition().balance(), v1::BALANCE_PARAMS);
  Status st = ParseError("model: convnet\npartition: {stages: 2, balance: params, boundaries: [3]}\n");
  EXPECT_THAT(std::string(st.message()), HasSubstr("boundaries or balance, not both"));
  st = ParseError("model: convnet\npartition: {stages: 2, balance: flops}\n");
  EXPECT_THAT(std::string(st.message()), HasSubstr("partition.balance: unknown value 'flops'"));
}

TEST(ModelCatalog, EvenPartitionsAndBoundaries) {
  auto spec = ParseJobYaml("model: convnet\npartition: {stages: 4}\n");
  ASSERT_TRUE(spec.ok());
  auto ranges = PartitionLayers(*spec);
  ASSERT_TRUE(ranges.ok());
  ASSERT_EQ(ranges->size(), 4u);
  EXPECT_EQ((*ranges)[0].begin, 0);
  EXPECT_EQ((*ranges)[1].begin, 3);
  EXPECT_EQ((*ranges)[3].end, 12);
  spec = ParseJobYaml("model: convnet\npartition: {boundaries: [3, 6, 11]}\n");
  ASSERT_TRUE(spec.ok());
  ranges = PartitionLayers(*spec);
  ASSERT_TRUE(ranges.ok());
  EXPECT_EQ((*ranges)[2].begin, 6);
  EXPECT_EQ((*ranges)[2].end, 11);
  EXPECT_EQ((*ranges)[3].begin, 11);
}

// loss: {torchscript: PATH} and save.format: torchscript (issue 17).
TEST(JobSpec, ScriptedLossesAndTorchScriptSaves) {
  const std::string script = "model: {torchscript: m.pt}\ndata: {format: tensors, train: t.pt}\n";
  auto spec = ParseJobYaml(script + "loss: {torchscript: loss.pt}\nsave: {path: out.pt, format: torchscript}\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->loss_torchscript(), "loss.pt");
  EXPECT_EQ(spec->loss(), v1::LOSS_UNSPECIFIED);
  EXPECT_EQ(spec->save_format(), v1::SAVE_FORMAT_TORCHSCRIPT);
  auto fails = [](const std::string& yaml, const std::string& says) {
    auto s = ParseJobYaml(yaml);
    EXPECT_TRUE(absl::IsInvalidArgument(s.status())) << yaml << ": " << s.status();
    EXPECT_THAT(std::string(s.status().message()), HasSubstr(says)) << yaml;
  };
  fails(script + "loss: {torchscript: ''}\n", "loss.torchscript: empty path");
  fails(script + "loss: {script: loss.pt}\n", "loss.script: unknown key");
  fails(script + "loss: huber\n", "loss.name: unknown value 'huber'");
  fails("model: toy\nsave: {path: out.pt, format: torchscript}\n",
        "save.format: torchscript needs a model from a TorchScript archive");
  fails(script + "save: {path: out.pt, format: onnx}\n", "(one of: state_dict, torchscript)");
}

// model: {exported: PATH}: one source only; cut_before for exported programs
// only; the layers are counted when the job is placed (stage 0 reads the file).
TEST(JobSpec, AnExportedProgramIsOneOfTheModelSources) {
  auto spec = ParseJobYaml("model: {exported: model.pt2, cut_before: \"bn, fc\"}\npartition: {stages: 3}\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model().kind(), v1::MODEL_EXPORTED);
  EXPECT_EQ(spec->model().exported(), "model.pt2");
  EXPECT_EQ(spec->model().cut_before(), "bn, fc");
  EXPECT_THAT(ParseError("model: {exported: a.pt2, torchscript: b.pt}").message(),
              ::testing::HasSubstr("give one of name (a zoo model), torchscript or exported (your model)"));
  EXPECT_THAT(ParseError("model: {name: toy, cut_before: fc}").message(),
              ::testing::HasSubstr("model.cut_before: for an exported program only"));
}

TEST(JobSpec, TokenDataNeedsDtypeAndSeqLen) {
  const std::string model = "model: {name: gpt, vocab: 50, width: 8, blocks: 1, heads: 2, seq_len: 8}\n";
  auto spec = ParseJobYaml(model + "data: {format: tokens, train: a.bin, test: b.bin, dtype: uint32, seq_len: 8}\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->data().kind(), v1::DATA_TOKENS);
  EXPECT_EQ(spec->data().token_dtype(), v1::TOKEN_DTYPE_UINT32);
  EXPECT_EQ(spec->data().seq_len(), 8);
  EXPECT_EQ(spec->data().train(), "a.bin");
  EXPECT_EQ(InputSampleShape(*spec), (std::vector<int64_t>{8}));
  EXPECT_EQ(LabelSampleShape(*spec), (std::vector<int64_t>{8}));
  EXPECT_EQ(InputDType(*spec), v1::DTYPE_INT64);
  EXPECT_EQ(LabelDType(*spec), v1::DTYPE_INT64);
  auto fails = [&](const std::string& yaml, const std::string& says) {
    auto s = ParseJobYaml(yaml);
    EXPECT_TRUE(absl::IsInvalidArgument(s.status())) << yaml;
    EXPECT_THAT(std::string(s.status().message()), HasSubstr(says)) << yaml;
  };
  fails(model + "data: {format: tokens, train: a.bin, seq_len: 8}\n", "data.dtype: missing");
  fails(model + "data: {format: tokens, train: a.bin, dtype: int8, seq_len: 8}\n",
        "data.dtype: unknown value 'int8' (one of: uint16, uint32)");
  fails(model + "data: {format: tokens, train: a.bin, dtype: uint16}\n", "data.seq_len: missing");
  fails(model + "data: {format: tokens, train: a.bin, dtype: uint16, seq_len: '8'}\n", "data.seq_len: expected an integer");
  fails(model + "data: {format: tokens, train: a.bin, dtype: uint16, seq_len: 0}\n", "data.seq_len: must be between 1");
  fails(model + "data: {format: tokens, dtype: uint16, seq_len: 8}\n", "data.train: missing");
  fails(model + "data: {format: tokens, train: a.bin, dtype: uint16, seq_len: 9}\n",
        "data.seq_len: 9 is longer than model.seq_len 8");
  fails("model: toy\ndata: {format: tokens, train: a.bin, dtype: uint16, seq_len: 8}\n", "use the gpt model or a TorchScript");
  fails(model + "data: {format: tensors, train: a.pt, seq_len: 8}\n", "data.seq_len: only with format: tokens");
  // Fashion-MNIST trains on all of its files: a sample count for it would be ignored.
  fails("model: convnet\ndata: {name: fashion-mnist, train_samples: 1000}\n", "data.train_samples: only with name: synthetic");
  fails("model: convnet\ndata: {name: fashion-mnist, test_samples: 100}\n", "data.test_samples: only with name: synthetic");
}


// docs/jobs.md's key reference is the table the parser reads, word for word.
TEST(JobKeys, DocsListEveryKey) {
  std::ifstream in(std::string(CONVEYOR_SOURCE_DIR) + "/docs/jobs.md");
  ASSERT_TRUE(in) << "docs/jobs.md not found";
  std::stringstream text;
  text << in.rdbuf();
  const std::string doc = text.str();
  const auto begin = doc.find("<!-- job-keys: begin");
  const auto end = doc.find("<!-- job-keys: end -->");
  ASSERT_NE(begin, std::string::npos);
  ASSERT_NE(end, std::string::npos);
  const auto table = doc.find("| key |", begin);
  ASSERT_LT(table, end);
  EXPECT_EQ(doc.substr(table, end - table), JobKeysMarkdown())
      << "docs/jobs.md's key table differs from plan/job_keys.cpp: replace it with `build/bin/conveyor keys`";
}

// Every row is complete, and every default is a value its own key accepts.
TEST(JobKeys, TheTableIsWhole) {
  std::set<std::string> seen;
  for (const JobKey& k : JobKeys()) {
    EXPECT_TRUE(seen.insert(k.key).second) << k.key << " twice";
    EXPECT_FALSE(k.doc.empty()) << k.key;
    const auto dot = k.key.rfind('.');
    if (dot != std::string::npos) {
      const JobKey* section = FindJobKey(k.key.substr(0, dot));
      ASSERT_NE(section, nullptr) << k.key;
      EXPECT_EQ(section->type, KeyType::kSection) << k.key;
    }
    if (k.type == KeyType::kSection) continue;
    if (k.type == KeyType::kCustom) {
      EXPECT_TRUE(k.read) << k.key;
    } else {
      EXPECT_TRUE(k.set) << k.key;
    }
    if (k.type == KeyType::kChoice) EXPECT_FALSE(k.choices.empty()) << k.key;
  }
  // ReadJobKeys applies every default first: a bad one fails every parse.
  EXPECT_TRUE(ParseJobYaml("model: toy").ok());
}

// Each range in the table is enforced at parse time and on typed specs.
TEST(JobKeys, RangesComeFromTheTable) {
  auto spec = ParseJobYaml("model: toy\nkeep_checkpoints: 1\n");
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("keep_checkpoints: must be between 2 and 1000, got 1"));
  auto ok = ParseJobYaml("model: toy");
  ASSERT_TRUE(ok.ok());
  v1::JobSpec typed = *ok;
  typed.set_nccl_ctas(65);
  EXPECT_THAT(std::string(ValidateJobSpec(typed).message()), HasSubstr("nccl_ctas: must be between 0 and 64, got 65"));
  typed = *ok;
  typed.mutable_optimizer()->set_lr(0);
  EXPECT_THAT(std::string(ValidateJobSpec(typed).message()), HasSubstr("optimizer.lr: must be more than 0"));
  // A key where it does not apply is named with where it does.
  EXPECT_THAT(std::string(ParseJobYaml("model: toy\noptimizer: {name: sgd, eps: 0.1}\n").status().message()),
              HasSubstr("optimizer.eps: only with name: adam"));
  // An unknown key lists the keys of its mapping.
  EXPECT_THAT(std::string(ParseJobYaml("model: toy\nsave: {paht: x.pt}\n").status().message()),
              HasSubstr("save.paht: unknown key (did you mean path?)"));
}

// save.path is checked before a job is queued: a folder is refused naming it,
// folders missing under it are made when the weights are written (as
// `conveyor export` does), and a file where a folder must be is refused.
TEST(SavePath, AFolderIsRefusedAndMissingFoldersAreMadeLater) {
  const std::string dir = testing::MakeTempDir("save-path");
  Status st = CheckSavePath(dir);
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr(dir + " is a folder; name the file to write in it"));
  EXPECT_TRUE(CheckSavePath(dir + "/weights.pt").ok());
  EXPECT_TRUE(CheckSavePath(dir + "/runs/3/weights.pt").ok()) << "missing folders are made when it is written";
  std::ofstream(dir + "/plain") << "x";
  st = CheckSavePath(dir + "/plain/weights.pt");
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr(dir + "/plain is a file, not a folder"));
  // Resolved under the data roots with its missing folders (it said "does not exist").
  v1::JobSpec spec;
  spec.set_save_path("runs/3/weights.pt");
  ASSERT_TRUE(ResolveJobPaths(&spec, {dir}).ok());
  EXPECT_EQ(spec.save_path(), std::filesystem::canonical(dir).string() + "/runs/3/weights.pt");
  spec.set_save_path("runs/../../outside.pt");
  EXPECT_FALSE(ResolveJobPaths(&spec, {dir}).ok());
  RemoveTree(dir);
}

// data.train as a pattern: the files it matches under the first data root,
// in byte order, each resolved; none, or a token file's pattern, is refused.
TEST(Shards, APatternBecomesTheFilesItMatchesInNameOrder) {
  const std::string dir = testing::MakeTempDir("shard-paths");
  for (const char* name : {"b-10.pt", "b-2.pt", "B-1.pt", "c.pt"}) std::ofstream(dir + "/" + name) << "x";
  v1::JobSpec spec;
  spec.mutable_data()->set_kind(v1::DATA_TENSORS);
  spec.mutable_data()->set_train("[bB]-*.pt");
  ASSERT_TRUE(ResolveJobPaths(&spec, {dir}).ok());
  const std::string real = std::filesystem::canonical(dir).string();
  EXPECT_EQ(std::vector<std::string>(spec.data().train_shards().begin(), spec.data().train_shards().end()),
            (std::vector<std::string>{real + "/B-1.pt", real + "/b-10.pt", real + "/b-2.pt"}));
  ASSERT_TRUE(ResolveJobPaths(&spec, {dir}).ok()) << "resolved again (a resumed job): the same list";
  EXPECT_EQ(spec.data().train_shards_size(), 3);
  spec.mutable_data()->set_train("none-*.pt");
  Status st = ResolveJobPaths(&spec, {dir});
  EXPECT_TRUE(absl::IsNotFound(st)) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("matches no file (it is relative: taken under the first data root"));
  spec.mutable_data()->set_kind(v1::DATA_TOKENS);
  spec.mutable_data()->set_train("b-*.pt");
  st = ResolveJobPaths(&spec, {dir});
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("shards are for format: tensors"));
  RemoveTree(dir);
}

// data.train as a YAML list: the shards in the list's order, each resolved
// under the data roots; a bad item is named; tokens read one file.
TEST(Shards, AListNamesTheShardsInItsOrder) {
  const std::string dir = testing::MakeTempDir("shard-list");
  for (const char* name : {"b.pt", "a.pt"}) std::ofstream(dir + "/" + name) << "x";
  const std::string job = "model: {name: mlp}\ndata: {format: tensors, train: [b.pt, a.pt]}\n";
  auto spec = ParseJobYaml(job);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->data().train().empty());
  ASSERT_TRUE(ResolveJobPaths(&*spec, {dir}).ok());
  const std::string real = std::filesystem::canonical(dir).string();
  EXPECT_EQ(std::vector<std::string>(spec->data().train_shards().begin(), spec->data().train_shards().end()),
            (std::vector<std::string>{real + "/b.pt", real + "/a.pt"}));
  ASSERT_TRUE(ResolveJobPaths(&*spec, {dir}).ok()) << "resolved again (a resumed job): the same list";
  EXPECT_EQ(spec->data().train_shards_size(), 2);

  auto missing = ParseJobYaml("model: {name: mlp}\ndata: {format: tensors, train: [b.pt, c.pt]}\n");
  ASSERT_TRUE(missing.ok());
  Status st = ResolveJobPaths(&*missing, {dir});
  EXPECT_TRUE(absl::IsNotFound(st)) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("c.pt does not exist"));
  auto bad = ParseJobYaml("model: {name: mlp}\ndata: {format: tensors, train: [b.pt, {x: 1}]}\n");
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status())) << bad.status();
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("data.train: item 1: expected a path"));
  auto tokens = ParseJobYaml("model: {name: gpt}\ndata: {format: tokens, train: [b.pt, a.pt], dtype: uint16, "
                             "seq_len: 8}\n");
  EXPECT_TRUE(absl::IsInvalidArgument(tokens.status())) << tokens.status();
  EXPECT_THAT(std::string(tokens.status().message()), HasSubstr("a list of files is for format: tensors"));
  RemoveTree(dir);
}

}  // namespace
}  // namespace conveyor
