// One Stage driven directly, without a coordinator: the errors a caller sees.
#include "stage_server/stage.h"
#include "stage_server/stage_metrics.h"
#include "transport/grpc/grpc_transport.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <future>

#include "cli/reference.h"
#include "model/state_dict.h"
#include "plan/job_spec.h"
#include "plan/model_catalog.h"
#include "transport/inproc_transport.h"
#include "tests/support/test_util.h"
#include "common/files.h"

namespace conveyor {
namespace {

using ::testing::HasSubstr;

class StageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StageOptions options;
    options.transports = &fabric_;
    auto s = Stage::Create(options);
    ASSERT_TRUE(s.ok()) << s.status();
    stage_ = std::move(*s);
    fabric_.Register("inproc://1", &stage_->inbox());
  }

  v1::StageAssignment Assignment(const std::string& yaml, int index, int stages, int begin, int end,
                                 std::vector<int64_t> input) {
    auto spec = ParseJobYaml(yaml);
    EXPECT_TRUE(spec.ok()) << spec.status();
    v1::StageAssignment a;
    a.set_job_id("job-1");
    *a.mutable_spec() = *spec;
    a.set_stage_index(index);
    a.set_num_stages(stages);
    a.set_num_chunks(stages);
    v1::ChunkAssignment* c = a.add_chunks();
    c->set_index(index);
    c->set_layer_begin(begin);
    c->set_layer_end(end);
    for (int64_t d : input) c->add_input_sample_shape(d);
    return a;
  }

  InProcFabric fabric_;
  std::unique_ptr<Stage> stage_;
};

TEST_F(StageTest, ConfigureReportsTheOutputShape) {
  auto reply = stage_->Configure(Assignment("model: convnet\npartition: {stages: 2}", 1, 2, 6, 12, {16, 4, 4}));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(std::vector<int64_t>(reply->output_sample_shape().begin(), reply->output_sample_shape().end()),
            std::vector<int64_t>{10});
  EXPECT_EQ(reply->num_parameters(), 256 * 120 + 120 + 120 * 84 + 84 + 84 * 10 + 10);
  EXPECT_EQ(stage_->Info().job_id(), "job-1");
}

TEST_F(StageTest, ConfigureRefusesChunksOfOtherStagesAndBrokenPromises) {
  auto a = Assignment("model: convnet\npartition: {stages: 2}", 1, 2, 6, 12, {16, 4, 4});
  a.mutable_chunks(0)->set_index(0);  // chunk 0 belongs to stage 0
  EXPECT_TRUE(absl::IsInvalidArgument(stage_->Configure(a).status()));
  a = Assignment("model: convnet\npartition: {stages: 2}", 1, 2, 6, 12, {16, 4, 4});
  a.mutable_chunks(0)->add_output_sample_shape(11);
  auto reply = stage_->Configure(a);
  EXPECT_TRUE(absl::IsInvalidArgument(reply.status()));
  EXPECT_THAT(std::string(reply.status().message()), HasSubstr("outputs samples of shape [10], the assignment says [11]"));
}

TEST_F(StageTest, ProbeReportsShapesAndKeepsNothing) {
  v1::ProbeRequest req;
  auto spec = ParseJobYaml("model: convnet");
  ASSERT_TRUE(spec.ok());
  *req.mutable_spec() = *spec;
  req.set_layer_begin(0);
  req.set_layer_end(6);
  for (int64_t d : {1, 28, 28}) req.add_input_sample_shape(d);
  auto reply = stage_->Probe(req);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(std::vector<int64_t>(reply->output_sample_shape().begin(), reply->output_sample_shape().end()),
            (std::vector<int64_t>{16, 4, 4}));
  EXPECT_EQ(stage_->Info().job_id(), "");
  req.set_input_sample_shape(0, 3);
  EXPECT_TRUE(absl::IsInvalidArgument(stage_->Probe(req).status()));
}

TEST_F(StageTest, ConfigureRefusesAShapeTheLayersCannotTake) {
  auto reply = stage_->Configure(Assignment("model: convnet\npartition: {stages: 2}", 1, 2, 6, 12, {3, 7}));
  EXPECT_TRUE(absl::IsInvalidArgument(reply.status())) << reply.status();
  EXPECT_THAT(std::string(reply.status().message()), HasSubstr("cannot take samples of shape [3, 7]"));
}

// float16 autocast is CUDA's: a CPU stage refuses fp16-mixed, naming itself.
TEST_F(StageTest, ConfigureRefusesFp16MixedOnTheCpu) {
  auto reply = stage_->Configure(Assignment("model: toy\nprecision: fp16-mixed", 0, 1, 0, 3, {10}));
  EXPECT_TRUE(absl::IsInvalidArgument(reply.status())) << reply.status();
  EXPECT_THAT(std::string(reply.status().message()),
              HasSubstr("stage 0 is on cpu: precision fp16-mixed needs a CUDA device"));
}

// checkpoint_every on a stage server without --checkpoint-dir failed the job
// at its first checkpoint (step 50), after the training before it; now when it
// is placed (replica 0's stages: the other copies write none).
TEST_F(StageTest, ConfigureRefusesCheckpointsWithoutACheckpointDir) {
  auto reply = stage_->Configure(Assignment("model: toy\ncheckpoint_every: 50\n", 0, 1, 0, 3, {10}));
  EXPECT_TRUE(absl::IsFailedPrecondition(reply.status())) << reply.status();
  EXPECT_THAT(std::string(reply.status().message()),
              HasSubstr("stage 0: the job has checkpoint_every: 50, but this stage server was started without "
                        "--checkpoint-dir"));
  reply = stage_->Configure(Assignment("model: toy\ncheckpoint_every: 0\n", 0, 1, 0, 3, {10}));
  EXPECT_TRUE(reply.ok()) << reply.status();
}

// A data file's targets that PyTorch's loss would refuse at its first step
// (out of range, float or int32 for cross_entropy, [N, 1] against [N, C]
// outputs, which were squeezed silently) are refused when the last stage is
// placed, and by the reference before it trains, naming the key, the file and
// the first bad sample.
TEST(StageTargets, BadTargetsAreNamedWhenTheJobIsPlaced) {
  const testing::ScopedTempDir folder("stage-targets");
  const std::string& dir = folder.path();
  StageOptions options;
  InProcFabric fabric;
  options.transports = &fabric;
  options.data_roots = {dir};
  auto stage = Stage::Create(options);
  ASSERT_TRUE(stage.ok()) << stage.status();
  const at::Tensor x = at::rand({6, 4});
  struct Case {
    at::Tensor targets;
    std::string loss, error;
  };
  const std::vector<Case> cases = {
      {at::tensor({0, 1, 2, 3, 1, 0}, at::kLong), "cross_entropy", "sample 3 has the target 3, outside the model's 3 classes [0, 3)"},
      {at::tensor({0, 1, -1, 0, 1, 2}, at::kLong), "nll", "sample 2 has the target -1"},
      {at::zeros({6}, at::kFloat), "cross_entropy", "its targets are Float, and cross_entropy takes class indices, int64"},
      {at::zeros({6}, at::kInt), "cross_entropy", "its targets are Int, and cross_entropy takes int64 class indices"},
      {at::zeros({6, 1}, at::kLong), "cross_entropy", "each target has shape [1], and the model's output of shape [3]"},
      {at::tensor({0, 1, 2, 0, 1, 2}, at::kLong), "cross_entropy", ""},
      {at::zeros({6, 3}, at::kFloat), "mse", ""}};
  int n = 0;
  for (const Case& c : cases) {
    const std::string path = dir + "/data" + std::to_string(n++) + ".pt";
    ASSERT_TRUE(WriteStateDict(path, {{"inputs", x}, {"targets", c.targets}}).ok());
    auto spec = ParseJobYaml("model: {name: mlp, input_dim: 4, hidden: [8], num_classes: 3}\n"
                             "data: {format: tensors, train: " + path + "}\nbatch_size: 2\nloss: " + c.loss + "\n");
    ASSERT_TRUE(spec.ok()) << spec.status();
    v1::StageAssignment a;
    a.set_job_id("job-" + std::to_string(n));
    *a.mutable_spec() = *spec;
    a.set_stage_index(0);
    a.set_num_stages(1);
    a.set_num_chunks(1);
    v1::ChunkAssignment* chunk = a.add_chunks();
    chunk->set_layer_begin(0);
    chunk->set_layer_end(NumLayers(spec->model()));
    chunk->add_input_sample_shape(4);
    auto reply = (*stage)->Configure(a);
    // The reference checks them alike, before it trains.
    auto ref = cli::TrainReference(*spec, cli::ReferenceOptions());
    if (c.error.empty()) {
      EXPECT_TRUE(reply.ok()) << path << ": " << reply.status();
      EXPECT_TRUE(ref.ok()) << path << ": " << ref.status();
    } else {
      EXPECT_TRUE(absl::IsInvalidArgument(reply.status())) << path << ": " << reply.status();
      EXPECT_THAT(std::string(reply.status().message()), HasSubstr("data.train: " + path + ": " + c.error));
      EXPECT_TRUE(absl::IsInvalidArgument(ref.status())) << path << ": " << ref.status();
      EXPECT_THAT(std::string(ref.status().message()), HasSubstr("data.train: " + path + ": " + c.error));
    }
  }
  RemoveTree(dir);
}

TEST_F(StageTest, ConfigureNamesAMissingDatasetPath) {
  auto reply = stage_->Configure(Assignment(
      "model: convnet\ndata: {name: fashion-mnist, path: /nowhere/fmnist}\n", 0, 1, 0, 12, {1, 28, 28}));
  EXPECT_TRUE(absl::IsNotFound(reply.status())) << reply.status();
  EXPECT_THAT(std::string(reply.status().message()), HasSubstr("/nowhere/fmnist"));
}

TEST_F(StageTest, CallsForAnotherJobAreRefused) {
  ASSERT_TRUE(stage_->Configure(Assignment("model: toy", 0, 1, 0, 3, {10})).ok());
  v1::RunStepRequest req;
  req.set_job_id("job-7");
  req.set_phase(v1::PHASE_TRAIN);
  req.set_batch_size(32);
  auto r = stage_->RunStep(req);
  EXPECT_TRUE(absl::IsFailedPrecondition(r.status())) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("runs job 'job-1', not 'job-7'"));
  req.set_job_id("job-1");
  req.set_batch_size(33);
  EXPECT_TRUE(absl::IsInvalidArgument(stage_->RunStep(req).status()));
  req.set_batch_size(32);
  EXPECT_TRUE(stage_->RunStep(req).ok());
}

// A step or update sent to an earlier configuration of the job (a call the
// coordinator cancelled before it configured the job anew, still on its way)
// is refused ABORTED, and the stage's state is the new configuration's: its
// own step 0 then runs, and holds its update for its own ApplyStep.
TEST_F(StageTest, CallsOfAnEarlierConfigurationAreRefused) {
  v1::StageAssignment a = Assignment("model: toy\noptimizer: {name: sgd, lr: 0.1}\nclip_grad_norm: 1.0\n", 0, 1, 0, 3, {10});
  a.set_deployment(2);
  ASSERT_TRUE(stage_->Configure(a).ok());
  v1::RunStepRequest req;
  req.set_job_id("job-1");
  req.set_phase(v1::PHASE_TRAIN);
  req.set_batch_size(32);
  req.set_defer_update(true);
  req.set_deployment(1);
  auto stale = stage_->RunStep(req);
  EXPECT_TRUE(absl::IsAborted(stale.status())) << stale.status();
  EXPECT_THAT(std::string(stale.status().message()),
              HasSubstr("step 0 was sent to configuration 1 of the job, and the coordinator has configured it anew "
                        "since (configuration 2): not run"));
  req.set_deployment(2);
  ASSERT_TRUE(stage_->RunStep(req).ok());
  v1::ApplyStepRequest apply;
  apply.set_job_id("job-1");
  apply.set_step(0);
  apply.set_grad_scale(1);
  apply.set_deployment(1);
  auto stale_apply = stage_->ApplyStep(apply);
  EXPECT_TRUE(absl::IsAborted(stale_apply.status())) << stale_apply.status();
  EXPECT_THAT(std::string(stale_apply.status().message()), HasSubstr("the update of step 0 was sent to configuration 1"));
  apply.set_deployment(2);
  EXPECT_TRUE(stage_->ApplyStep(apply).ok()) << "the stale update left the held one alone";
}

// clip_grad_norm over several stages: RunStep holds the update, ApplyStep
// makes it once, scaled; an ApplyStep with nothing held is refused.
TEST_F(StageTest, ADeferredUpdateIsAppliedOnceScaled) {
  ASSERT_TRUE(stage_->Configure(Assignment("model: toy\noptimizer: {name: sgd, lr: 0.1}\nclip_grad_norm: 1.0\n"
                                           "lr_schedule: {warmup_steps: 4}\n",
                                           0, 1, 0, 3, {10}))
                  .ok());
  v1::ApplyStepRequest apply;
  apply.set_job_id("job-1");
  apply.set_step(0);
  apply.set_grad_scale(0.5);
  auto a = stage_->ApplyStep(apply);
  EXPECT_TRUE(absl::IsFailedPrecondition(a.status())) << a.status();
  EXPECT_THAT(std::string(a.status().message()), HasSubstr("no deferred update of step 0"));
  v1::RunStepRequest req;
  req.set_job_id("job-1");
  req.set_phase(v1::PHASE_TRAIN);
  req.set_batch_size(32);
  req.set_total_steps(10);
  req.set_defer_update(true);
  auto r = stage_->RunStep(req);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_DOUBLE_EQ(r->lr(), 0.1 / 4);  // the warmup's first step
  EXPECT_GT(r->grad_sq_norm(), 0);
  apply.set_grad_scale(1.5);
  EXPECT_TRUE(absl::IsInvalidArgument(stage_->ApplyStep(apply).status()));
  apply.set_grad_scale(0.5);
  EXPECT_TRUE(stage_->ApplyStep(apply).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(stage_->ApplyStep(apply).status()));  // once
}

TEST_F(StageTest, AStageWhoseNeighbourNeverSendsTimesOutNamingIt) {
  // Stage 1 of 2; stage 0 (inproc://0) exists but never runs.
  StageOptions options;
  options.transports = &fabric_;
  auto upstream = Stage::Create(options);
  ASSERT_TRUE(upstream.ok());
  fabric_.Register("inproc://0", &(*upstream)->inbox());
  // Its 10 minutes of stage_timeout pass on a fake clock, in no real time.
  FakeClock clock;
  options.clock = &clock;
  auto waiting = Stage::Create(options);
  ASSERT_TRUE(waiting.ok());
  auto a = Assignment("model: toy\npartition: {stages: 2}\nstage_timeout: 600", 1, 2, 1, 3, {10});
  a.set_upstream("inproc://0");
  ASSERT_TRUE((*waiting)->Configure(a).ok());
  v1::JobRef ref;
  ref.set_job_id("job-1");
  ASSERT_TRUE((*waiting)->Connect(ref).ok());
  v1::RunStepRequest req;
  req.set_job_id("job-1");
  req.set_phase(v1::PHASE_TRAIN);
  req.set_batch_size(32);
  auto step = std::async(std::launch::async, [&] { return (*waiting)->RunStep(req); });
  ASSERT_TRUE(clock.AwaitWaiters(1, std::chrono::seconds(60))) << "the stage never waited for its neighbour";
  clock.Advance(std::chrono::seconds(599));
  EXPECT_EQ(step.wait_for(std::chrono::seconds(0)), std::future_status::timeout) << "gave up before stage_timeout";
  clock.Advance(std::chrono::seconds(2));
  auto r = step.get();
  EXPECT_TRUE(absl::IsDeadlineExceeded(r.status())) << r.status();
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("waited too long for the activation of step 0 micro-batch 0 from stage 0 (upstream)"));
}

// Two training steps sent at once (steps_in_flight: 2) may reach a stage in
// either order: a step waits for the one before it to begin, an Abort ends
// that wait, and one whose predecessor never comes fails after stage_timeout.
TEST_F(StageTest, ATrainingStepThatComesFirstWaitsForTheStepBeforeIt) {
  const std::string yaml = "model: toy\noptimizer: {name: sgd, lr: 0.1}\nseed: 3\nstage_timeout: 600\n";
  auto step = [](int64_t k) {
    v1::RunStepRequest req;
    req.set_job_id("job-1");
    req.set_phase(v1::PHASE_TRAIN);
    req.set_batch_size(32);
    req.set_total_steps(10);
    req.set_step(k);
    return req;
  };
  // In order, on the fixture's stage.
  ASSERT_TRUE(stage_->Configure(Assignment(yaml, 0, 1, 0, 3, {10})).ok());
  auto first = stage_->RunStep(step(0));
  auto second = stage_->RunStep(step(1));
  ASSERT_TRUE(first.ok() && second.ok()) << first.status() << second.status();
  v1::JobRef ref;
  ref.set_job_id("job-1");
  auto digest = stage_->GetDigest(ref);
  ASSERT_TRUE(digest.ok());

  // Step 1 first, on a stage whose waits run on a fake clock.
  FakeClock clock;
  StageOptions options;
  options.transports = &fabric_;
  options.clock = &clock;
  auto other = Stage::Create(options);
  ASSERT_TRUE(other.ok());
  Stage& s = **other;
  ASSERT_TRUE(s.Configure(Assignment(yaml, 0, 1, 0, 3, {10})).ok());
  auto early = std::async(std::launch::async, [&] { return s.RunStep(step(1)); });
  ASSERT_TRUE(clock.AwaitWaiters(1, std::chrono::seconds(60))) << "step 1 did not wait for step 0";
  auto late = s.RunStep(step(0));
  auto after = early.get();
  ASSERT_TRUE(late.ok() && after.ok()) << late.status() << after.status();
  EXPECT_EQ(late->loss_sum(), first->loss_sum());
  EXPECT_EQ(after->loss_sum(), second->loss_sum());
  auto again = s.GetDigest(ref);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->SerializeAsString(), digest->SerializeAsString());

  // Step 5 after step 1: an Abort ends its wait.
  auto aborted = std::async(std::launch::async, [&] { return s.RunStep(step(5)); });
  ASSERT_TRUE(clock.AwaitWaiters(1, std::chrono::seconds(60)));
  v1::AbortRequest abort;
  abort.set_job_id("job-1");
  abort.set_reason("a test");
  ASSERT_TRUE(s.Abort(abort).ok());
  auto r = aborted.get();
  EXPECT_TRUE(absl::IsAborted(r.status())) << r.status();

  // Configured anew, step 3 first: step 0 never comes.
  ASSERT_TRUE(s.Configure(Assignment(yaml, 0, 1, 0, 3, {10})).ok());
  auto stranded = std::async(std::launch::async, [&] { return s.RunStep(step(3)); });
  ASSERT_TRUE(clock.AwaitWaiters(1, std::chrono::seconds(60)));
  clock.Advance(std::chrono::seconds(601));
  r = stranded.get();
  EXPECT_TRUE(absl::IsDeadlineExceeded(r.status())) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("training step 3 came, but step 0 did not within stage_timeout"));
}

TEST(StageCreate, UnknownOrMissingDevices) {
  InProcFabric fabric;
  StageOptions options;
  options.transports = &fabric;
  options.device = "tpu:0";
  EXPECT_TRUE(absl::IsInvalidArgument(Stage::Create(options).status()));
  options.device = "cuda:0";
  auto s = Stage::Create(options);
  if (s.ok()) GTEST_SKIP() << "this machine has CUDA";
  EXPECT_TRUE(absl::IsFailedPrecondition(s.status())) << s.status();
}

// The stage server wraps its transports to count bytes (stage_metrics.h):
// the wrapper must hand the NCCL link's setup to the real factory, or every
// NCCL link of a stage server process fails "these links have no NCCL" (it
// did, unseen until a run on two GPUs). On the CPU the gRPC factory answers
// for itself: not a CUDA device.
TEST(CountingTransports, PassPrepareLinkToTheRealFactory) {
  GrpcTransportFactory grpc;
  auto counting = CountingTransports(&grpc);
  std::shared_ptr<PreparedLink> prepared;
  auto link = counting->PrepareLink("cpu", NcclOptions(), &prepared);
  ASSERT_FALSE(link.ok());
  EXPECT_THAT(std::string(link.status().message()), ::testing::HasSubstr("cpu cannot use NCCL (not a CUDA device)"));
  EXPECT_EQ(counting->SupportsNccl(), grpc.SupportsNccl());
}

}  // namespace
}  // namespace conveyor
