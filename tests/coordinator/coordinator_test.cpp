// The coordinator over in-process stages: job API semantics, bad input, and
// recovery timeouts by a fake clock.
#include "coordinator/coordinator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <string_view>
#include <thread>

#include "common/files.h"
#include "common/server.h"
#include "conveyor.grpc.pb.h"
#include "common/clock.h"
#include "plan/job_spec.h"
#include "tests/support/in_process.h"
#include "tests/support/test_util.h"

namespace conveyor {
namespace {

using ::testing::HasSubstr;
using testing::InProcessCluster;
using testing::RunToEnd;
using testing::WaitForEnd;

const char* kToy = "name: toy\nmodel: toy\npartition: {stages: 3}\nbatch_size: 8\nmicro_batches: 2\nsteps: 5\n";
const char* kEndless = "name: endless\nmodel: toy\npartition: {stages: 2}\nbatch_size: 8\nsteps: 100000000\n";

// Waits for `job_id` to satisfy `done`, on change notifications.
v1::JobStatus WaitFor(Coordinator& c, const std::string& job_id, const std::function<bool(const v1::JobStatus&)>& done) {
  uint64_t version = 0;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  for (;;) {
    auto s = c.Watch(job_id, &version, deadline, true);
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok() || done(*s) || std::chrono::steady_clock::now() > deadline) return s.ok() ? *s : v1::JobStatus();
  }
}

TEST(Coordinator, RunsAJobAndAnswersAboutIt) {
  InProcessCluster cluster(3);
  auto c = cluster.StartCoordinator();
  v1::JobStatus s = RunToEnd(*c, kToy);
  EXPECT_EQ(s.state(), v1::JOB_STATE_SUCCEEDED) << s.error();
  EXPECT_EQ(s.step(), 5);
  EXPECT_EQ(s.losses_size(), 5);
  EXPECT_EQ(s.stages_size(), 3);
  EXPECT_EQ(s.stages(0).transport(), v1::LINK_IN_PROCESS);
  EXPECT_EQ(s.param_digest().size(), 64u);
  // Its curves: a row per step, with the status's losses.
  auto curves = c->GetCurves(s.job_id());
  ASSERT_TRUE(curves.ok()) << curves.status();
  ASSERT_EQ(curves->steps_size(), 5);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(curves->steps(i).step(), i + 1);
    EXPECT_FLOAT_EQ(static_cast<float>(curves->steps(i).loss()), s.losses(i));
    EXPECT_GT(curves->steps(i).step_seconds(), 0);
  }
  EXPECT_TRUE(absl::IsNotFound(c->GetCurves("job-404").status()));
  auto list = c->List();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].job_id(), s.job_id());
  auto again = c->Cancel(s.job_id());
  EXPECT_TRUE(absl::IsFailedPrecondition(again.status())) << again.status();
  EXPECT_THAT(std::string(again.status().message()), HasSubstr("already succeeded"));
}

// steps_in_flight: 2 (the default) sends step N+1 before step N's replies
// come; the stages run them in order: the same losses and weights as one step
// at a time, also when every frame comes late by a random delay.
TEST(Coordinator, TwoStepsInFlightTrainAsOneAtATime) {
  const std::string yaml = "model: toy\npartition: {stages: 3}\nbatch_size: 8\nmicro_batches: 2\nsteps: 12\n"
                           "optimizer: {name: adam, lr: 0.01}\n";
  std::vector<v1::JobStatus> runs;
  for (const char* in_flight : {"1", "2"}) {
    auto rng = std::make_shared<std::mt19937_64>(16);
    auto mu = std::make_shared<std::mutex>();
    InProcessCluster cluster(3, [rng, mu] {
      std::lock_guard<std::mutex> lock(*mu);
      return std::chrono::microseconds((*rng)() % 300);
    });
    auto c = cluster.StartCoordinator();
    runs.push_back(RunToEnd(*c, yaml + "steps_in_flight: " + in_flight + "\n"));
    ASSERT_EQ(runs.back().state(), v1::JOB_STATE_SUCCEEDED) << runs.back().error();
  }
  ASSERT_EQ(runs[0].losses_size(), 12);
  for (int i = 0; i < 12; ++i) EXPECT_EQ(runs[0].losses(i), runs[1].losses(i)) << "step " << i + 1;
  EXPECT_EQ(runs[0].param_digest(), runs[1].param_digest());
}

TEST(Coordinator, BadJobsAreRefusedWithTheReason) {
  InProcessCluster cluster(2);
  auto c = cluster.StartCoordinator();
  auto id = c->Submit("model: toy\nbatch_sise: 8\n");
  EXPECT_TRUE(absl::IsInvalidArgument(id.status()));
  EXPECT_THAT(std::string(id.status().message()), HasSubstr("batch_sise: unknown key"));
  id = c->Submit("model: toy\nbatch_size: 4\nmicro_batches: 8\n");
  EXPECT_TRUE(absl::IsInvalidArgument(id.status()));
  id = c->Submit("model: toy\npartition: {stages: 3}\n");  // the coordinator has 2
  EXPECT_TRUE(absl::IsFailedPrecondition(id.status()));
  EXPECT_THAT(std::string(id.status().message()), HasSubstr("needs 3 stages, this coordinator has 2"));
  id = c->Submit("model: toy\npartition: {stages: 2}\nreplicas: 2\nmicro_batches: 2\n");  // 4 servers
  EXPECT_TRUE(absl::IsInvalidArgument(id.status())) << id.status();
  EXPECT_THAT(std::string(id.status().message()),
              HasSubstr("replicas: 2 copies of 2 stages need 4 stage servers, this coordinator has 2"));
  EXPECT_TRUE(absl::IsNotFound(c->Get("job-42").status()));
  EXPECT_TRUE(absl::IsNotFound(c->Cancel("job-42").status()));
  EXPECT_TRUE(absl::IsNotFound(c->Get("").status()));
  // Still serving.
  EXPECT_EQ(RunToEnd(*c, "model: toy\npartition: {stages: 2}\nsteps: 2\n").state(), v1::JOB_STATE_SUCCEEDED);
}

TEST(Coordinator, AMissingDatasetIsRefusedAtSubmissionNamingThePath) {
  InProcessCluster cluster(2);
  auto c = cluster.StartCoordinator();
  auto id = c->Submit("model: convnet\npartition: {stages: 2}\ndata: {name: fashion-mnist, path: /no/data}\n");
  EXPECT_EQ(id.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(id.status().message(), HasSubstr("data.path: /no/data does not exist"));
  auto list = c->List();
  ASSERT_TRUE(list.ok());
  EXPECT_TRUE(list->empty());  // nothing was queued
}

TEST(Coordinator, CancelsRunningAndQueuedJobs) {
  InProcessCluster cluster(2);
  auto c = cluster.StartCoordinator();
  auto running = c->Submit(kEndless);
  auto queued = c->Submit(kEndless);
  ASSERT_TRUE(running.ok() && queued.ok());
  WaitFor(*c, *running, [](const v1::JobStatus& s) { return s.step() > 2; });
  auto q = c->Get(*queued);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->state(), v1::JOB_STATE_QUEUED);  // one job at a time
  auto cq = c->Cancel(*queued);
  ASSERT_TRUE(cq.ok()) << cq.status();
  EXPECT_EQ(cq->state(), v1::JOB_STATE_CANCELLED);
  ASSERT_TRUE(c->Cancel(*running).ok());
  v1::JobStatus s = WaitFor(*c, *running, [](const v1::JobStatus& s) { return s.state() != v1::JOB_STATE_RUNNING; });
  EXPECT_EQ(s.state(), v1::JOB_STATE_CANCELLED);
  EXPECT_THAT(s.error(), HasSubstr("cancelled by the user"));
  // The stages are free for the next job.
  EXPECT_EQ(RunToEnd(*c, "model: toy\npartition: {stages: 2}\nsteps: 2\n").state(), v1::JOB_STATE_SUCCEEDED);
}

// A watch (omit_losses) carries none of the per-step series, which grow with
// every step, and keeps their last figures; a plain Get has the series. For a
// running job (the live status) and for one that ended (the store's).
TEST(Coordinator, LeavingTheSeriesOutKeepsTheLastStepsFigures) {
  InProcessCluster cluster(2);
  auto c = cluster.StartCoordinator();
  const std::string job = std::string(kEndless) + "optimizer: {name: sgd, lr: 0.05}\nclip_grad_norm: 1.0\n" +
                          "loss_scale: {dynamic: true}\n";
  auto id = c->Submit(job);
  ASSERT_TRUE(id.ok()) << id.status();
  WaitFor(*c, *id, [](const v1::JobStatus& s) { return s.step() > 3; });
  auto expect_series_left_out = [&](const char* when) {
    auto full = c->Get(*id);
    auto slim = c->Get(*id, /*omit_losses=*/true);
    ASSERT_TRUE(full.ok() && slim.ok()) << when;
    ASSERT_GT(full->lrs_size(), 0) << when;
    ASSERT_GT(full->grad_norms_size(), 0) << when;
    ASSERT_GT(full->loss_scales_size(), 0) << when;
    EXPECT_GT(full->losses_size(), 0) << when;
    EXPECT_GT(full->step_seconds_size(), 0) << when;
    EXPECT_EQ(slim->losses_size() + slim->lrs_size() + slim->grad_norms_size() + slim->loss_scales_size() +
                  slim->step_seconds_size(),
              0)
        << when;
    // A running job may have taken a step between the two calls: the slim status's figures are its own step's.
    if (slim->step() != full->step()) return;
    ASSERT_TRUE(slim->has_lr() && slim->has_grad_norm() && slim->has_loss_scale()) << when;
    EXPECT_EQ(slim->lr(), full->lrs(full->lrs_size() - 1)) << when;
    EXPECT_EQ(slim->grad_norm(), full->grad_norms(full->grad_norms_size() - 1)) << when;
    EXPECT_EQ(slim->loss_scale(), full->loss_scales(full->loss_scales_size() - 1)) << when;
    EXPECT_EQ(slim->loss(), full->loss()) << when;
  };
  expect_series_left_out("running");
  ASSERT_TRUE(c->Cancel(*id).ok());
  WaitFor(*c, *id, [](const v1::JobStatus& s) { return IsTerminal(s.state()); });
  expect_series_left_out("cancelled");
  auto list = c->List();
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].grad_norms_size() + (*list)[0].lrs_size() + (*list)[0].step_seconds_size(), 0);
  EXPECT_TRUE((*list)[0].has_grad_norm());
}

TEST(Coordinator, RunsJobsInSubmissionOrder) {
  InProcessCluster cluster(2);
  auto c = cluster.StartCoordinator();
  auto a = c->Submit("name: a\nmodel: toy\npartition: {stages: 2}\nsteps: 30\n");
  auto b = c->Submit("name: b\nmodel: toy\npartition: {stages: 2}\nsteps: 3\n");
  ASSERT_TRUE(a.ok() && b.ok());
  v1::JobStatus sb = WaitFor(*c, *b, [](const v1::JobStatus& s) { return s.state() == v1::JOB_STATE_SUCCEEDED; });
  auto sa = c->Get(*a);
  ASSERT_TRUE(sa.ok());
  EXPECT_EQ(sa->state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_LE(sa->finished_unix_ms(), sb.started_unix_ms());
}

// The coordinator's stages are a pool: jobs that fit side by side run at
// once on servers of their own; one that does not fit waits for free
// servers, and the jobs behind it wait with it (first come, first served).
TEST(Coordinator, JobsThatFitRunSideBySideAndTheOthersQueueInOrder) {
  InProcessCluster cluster(3);
  auto c = cluster.StartCoordinator();
  const std::string one = "model: toy\nbatch_size: 8\nsteps: 100000000\n";  // 1 stage
  auto a = c->Submit("name: a\n" + one);
  auto b = c->Submit("name: b\n" + one);
  auto big = c->Submit("name: big\nmodel: toy\npartition: {stages: 2}\nbatch_size: 8\nsteps: 3\n");
  auto small = c->Submit("name: small\nmodel: toy\nsteps: 3\n");
  ASSERT_TRUE(a.ok() && b.ok() && big.ok() && small.ok());
  // a and b train at the same time, each on a server of its own.
  v1::JobStatus sa = WaitFor(*c, *a, [](const v1::JobStatus& s) { return s.step() > 2; });
  v1::JobStatus sb = WaitFor(*c, *b, [](const v1::JobStatus& s) { return s.step() > 2; });
  sa = *c->Get(*a);
  EXPECT_EQ(sa.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(sb.state(), v1::JOB_STATE_RUNNING);
  ASSERT_EQ(sa.stages_size(), 1);
  ASSERT_EQ(sb.stages_size(), 1);
  EXPECT_NE(sa.stages(0).address(), sb.stages(0).address());
  // One server is free, but `big` needs two: it waits, and `small` behind it.
  EXPECT_EQ(c->Get(*big)->state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(c->Get(*small)->state(), v1::JOB_STATE_QUEUED);
  std::map<std::string, int> use;
  for (const auto& h : c->ListStages()) ++use[h.running_job()];
  EXPECT_EQ(use[*a], 1);
  EXPECT_EQ(use[*b], 1);
  EXPECT_EQ(use[""], 1);
  // a ends: `big` gets its server and the free one; then `small` runs.
  ASSERT_TRUE(c->Cancel(*a).ok());
  v1::JobStatus sbig = WaitFor(*c, *big, [](const v1::JobStatus& s) { return IsTerminal(s.state()); });
  EXPECT_EQ(sbig.state(), v1::JOB_STATE_SUCCEEDED) << sbig.error();
  v1::JobStatus ssmall = WaitFor(*c, *small, [](const v1::JobStatus& s) { return IsTerminal(s.state()); });
  EXPECT_EQ(ssmall.state(), v1::JOB_STATE_SUCCEEDED) << ssmall.error();
  EXPECT_GE(ssmall.started_unix_ms(), sbig.started_unix_ms());
  EXPECT_EQ(c->Get(*b)->state(), v1::JOB_STATE_RUNNING);  // all along, beside them
  ASSERT_TRUE(c->Cancel(*b).ok());
  EXPECT_EQ(WaitFor(*c, *b, [](const v1::JobStatus& s) { return IsTerminal(s.state()); }).state(),
            v1::JOB_STATE_CANCELLED);
}

// A job that was running when the coordinator stopped runs again after a
// restart: here without checkpoints, so from step 0.
TEST(Coordinator, ARestartResumesTheInterruptedJob) {
  const testing::ScopedTempDir folder("coordinator-restart");
  const std::string& dir = folder.path();
  const std::string yaml = "model: toy\nsteps: 5\n";
  std::string id;
  {
    auto store = JobStore::Open(dir + "/conveyor.db");
    ASSERT_TRUE(store.ok());
    auto spec = ParseJobYaml(yaml);
    ASSERT_TRUE(spec.ok());
    auto inserted = (*store)->Insert(*spec, yaml, v1::JobStatus());
    ASSERT_TRUE(inserted.ok());
    id = *inserted;
    auto job = (*store)->Get(id);
    job->status.set_state(v1::JOB_STATE_RUNNING);
    job->status.set_step(3);
    job->status.add_losses(1.0f);
    ASSERT_TRUE((*store)->Update(job->status).ok());
    // Curve rows of a longer run than the one that resumes (steps 1 to 7).
    std::vector<v1::CurvePoint> stale(7);
    for (int i = 0; i < 7; ++i) {
      stale[i].set_step(i + 1);
      stale[i].set_loss(99);
    }
    ASSERT_TRUE((*store)->AddCurves(id, stale, {}).ok());
  }
  InProcessCluster cluster(1);
  auto c = cluster.StartCoordinator(dir);
  ASSERT_TRUE(c);
  v1::JobStatus s = WaitFor(*c, id, [](const v1::JobStatus& s) { return IsTerminal(s.state()); });
  EXPECT_EQ(s.state(), v1::JOB_STATE_SUCCEEDED) << s.error();
  EXPECT_EQ(c->Get(id)->losses_size(), 5);
  auto curves = c->GetCurves(id);  // the run's own rows, none left of the earlier run
  ASSERT_TRUE(curves.ok()) << curves.status();
  ASSERT_EQ(curves->steps_size(), 5);
  for (const auto& p : curves->steps()) EXPECT_NE(p.loss(), 99) << "step " << p.step();
  std::string events;
  for (const auto& e : s.events()) events += e.text() + "\n";
  EXPECT_THAT(events, HasSubstr("the coordinator restarted while the job ran"));
  EXPECT_THAT(events, HasSubstr("the job starts again from step 0"));
}

// SIGTERM to the coordinator (a pod moved, a Slurm job requeued) is not a
// cancel: the running job stays running in the job store, and the next
// coordinator with that state runs it again.
TEST(Coordinator, AShutdownLeavesTheRunningJobToResumeAtTheNextStart) {
  const testing::ScopedTempDir folder("coordinator-shutdown");
  const std::string& dir = folder.path();
  InProcessCluster cluster(2);
  std::string id;
  {
    auto c = cluster.StartCoordinator(dir);
    ASSERT_TRUE(c);
    auto submitted = c->Submit(kEndless);
    ASSERT_TRUE(submitted.ok()) << submitted.status();
    id = *submitted;
    WaitFor(*c, id, [](const v1::JobStatus& s) { return s.step() > 2; });
    c->Shutdown();
    auto stopped = c->Get(id);
    ASSERT_TRUE(stopped.ok());
    EXPECT_EQ(stopped->state(), v1::JOB_STATE_RUNNING) << stopped->error();
    EXPECT_EQ(stopped->error(), "");
    // A watch ends with the coordinator (UNAVAILABLE: its watcher waits for
    // the next one), not with a status of the job as it stops.
    uint64_t version = 0;
    auto watched = c->Watch(id, &version, std::chrono::steady_clock::now() + std::chrono::seconds(60), true);
    EXPECT_EQ(watched.status().code(), absl::StatusCode::kUnavailable) << watched.status();
  }
  auto c = cluster.StartCoordinator(dir);
  ASSERT_TRUE(c);
  v1::JobStatus again = WaitFor(*c, id, [](const v1::JobStatus& s) { return s.state() == v1::JOB_STATE_RUNNING && s.step() > 0; });
  std::string events;
  for (const auto& e : again.events()) events += e.text() + "\n";
  EXPECT_THAT(events, HasSubstr("the coordinator stopped; the job resumes when it starts again"));
  EXPECT_THAT(events, HasSubstr("the coordinator restarted while the job ran"));
  ASSERT_TRUE(c->Cancel(id).ok());
  EXPECT_EQ(WaitFor(*c, id, [](const v1::JobStatus& s) { return IsTerminal(s.state()); }).state(),
            v1::JOB_STATE_CANCELLED);
}

// A stage that was not there when first dialled: the client's channel then
// backs off before it dials again; Reconnect (every job's start) makes a new
// channel, which resolves the name again and dials at once.
TEST(GrpcStageClient, ReconnectReachesAStageThatCameUpSinceTheLastFailure) {
  v1::StageControl::Service unimplemented;  // every call: UNIMPLEMENTED
  int port = 0;
  {
    auto free = GrpcServer::Start("127.0.0.1:0", {&unimplemented});  // a free port: bound, then released
    ASSERT_TRUE(free.ok()) << free.status();
    port = (*free)->port();
    (*free)->Shutdown(0);
  }
  const std::string address = "127.0.0.1:" + std::to_string(port);
  auto client = MakeGrpcStageClient(address);
  for (int i = 0; i < 3; ++i) {
    auto down = client->Ping(5);
    EXPECT_TRUE(absl::IsUnavailable(down.status())) << down.status();
  }
  auto server = GrpcServer::Start(address, {&unimplemented});
  ASSERT_TRUE(server.ok()) << server.status();
  client->Reconnect();
  // It has no StageControl (UNIMPLEMENTED), but it was reached.
  auto up = client->Ping(5);
  EXPECT_FALSE(absl::IsUnavailable(up.status())) << up.status();
}

}  // namespace
}  // namespace conveyor

namespace conveyor {
namespace {

// transport: nccl never falls back silently: a link between CPU stages fails
// the job with FAILED_PRECONDITION naming the link; auto and grpc run.
TEST(Coordinator, NcclOnCpuStagesFailsTheJobNamingTheLink) {
  InProcessCluster cluster(2);
  auto c = cluster.StartCoordinator();
  const std::string toy = "model: toy\npartition: {stages: 2}\nbatch_size: 8\nsteps: 2\n";
  v1::JobStatus s = RunToEnd(*c, toy + "transport: nccl\n");
  EXPECT_EQ(s.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(s.error(), HasSubstr("transport nccl: the link stage 0 -> stage 1 cannot use NCCL: stage 0 is on cpu"));
  for (const char* t : {"auto", "grpc"}) {
    s = RunToEnd(*c, toy + "transport: " + t + "\n");
    EXPECT_EQ(s.state(), v1::JOB_STATE_SUCCEEDED) << t << ": " << s.error();
    EXPECT_EQ(s.stages(0).transport(), v1::LINK_IN_PROCESS);
  }
  auto id = c->Submit(toy + "transport: infiniband\n");
  EXPECT_TRUE(absl::IsInvalidArgument(id.status()));
  EXPECT_THAT(std::string(id.status().message()), HasSubstr("transport"));
}

}  // namespace
}  // namespace conveyor

namespace conveyor {
namespace {

// A client of an in-process stage that goes away: from the reply of training
// step `last_step` on (the stage ran that step, the reply never came), every
// call fails UNAVAILABLE like a refused connection; -1: never. The reply of
// an earlier step still comes when it ends later (with two steps in flight,
// the thread that carries step N's reply may run after step N+1's).
class VanishingStageClient : public StageClient {
 public:
  VanishingStageClient(Stage* stage, std::string address, int64_t last_step)
      : stage_(stage), address_(std::move(address)), last_step_(last_step) {}
  const std::string& address() const override { return address_; }
#define CONVEYOR_STAGE_VANISHING(Name, Request, Reply, Thread, How) \
  StatusOr<Reply> Name(const Request& request, double) override {   \
    if (gone_) return Gone();                                       \
    auto reply = stage_->Name(request);                             \
    if (Vanishes(request)) return Gone();                           \
    return reply;                                                   \
  }
  CONVEYOR_STAGE_CONTROL_OPS(CONVEYOR_STAGE_VANISHING)
#undef CONVEYOR_STAGE_VANISHING

 private:
  // Whether the reply of a call that ran is lost.
  bool Vanishes(const v1::RunStepRequest& r) {
    const int64_t step = r.phase() == v1::PHASE_TRAIN ? r.step() : -1;
    if (last_step_ >= 0 && step >= last_step_ && !gone_.exchange(true)) {
      // A server that died runs nothing more: a step sent after this one
      // (two in flight) ends rather than wait for its neighbour.
      v1::AbortRequest abort;
      abort.set_job_id(r.job_id());
      abort.set_reason("the server died");
      (void)stage_->Abort(abort);
    }
    return gone_ && (step < 0 || step >= last_step_);
  }
  template <typename Request>
  bool Vanishes(const Request&) {
    return gone_;
  }
  Status Gone() const { return absl::UnavailableError(address_ + " is not there: connection refused"); }

  Stage* stage_;
  std::string address_;
  int64_t last_step_;
  std::atomic<bool> gone_{false};
};

TEST(FakeClock, AWaitEndsWhenTheTimeIsAdvancedPastItsDeadlineOrItsConditionHolds) {
  FakeClock clock;
  std::mutex mu;
  std::condition_variable cv;
  bool flag = false;
  std::thread timed_out([&] {
    std::unique_lock<std::mutex> lock(mu);
    EXPECT_FALSE(clock.WaitUntil(cv, lock, clock.After(10), [&] { return flag; }));
  });
  ASSERT_TRUE(clock.AwaitWaiters(1, std::chrono::seconds(10)));
  clock.Advance(std::chrono::seconds(9));  // not yet
  clock.Advance(std::chrono::seconds(1));
  timed_out.join();
  std::thread woken([&] {
    std::unique_lock<std::mutex> lock(mu);
    EXPECT_TRUE(clock.WaitUntil(cv, lock, clock.After(10), [&] { return flag; }));
  });
  ASSERT_TRUE(clock.AwaitWaiters(1, std::chrono::seconds(10)));
  {
    std::lock_guard<std::mutex> lock(mu);
    flag = true;
  }
  cv.notify_all();
  woken.join();
}

// What the clients of RunOverTwoStages share: stage `index` of the two, at
// `address`, and the test's state they note or wait on.
template <typename Shared>
class TwoStageClient : public StageClient {
 public:
  TwoStageClient(Stage* stage, std::string address, int index, Shared* shared)
      : stage_(stage), address_(std::move(address)), index_(index), shared_(shared) {}
  const std::string& address() const override { return address_; }

 protected:
  Stage* stage_;
  std::string address_;
  int index_;
  Shared* shared_;
};

// Runs `yaml` to its end on a coordinator over two in-process stages, each
// reached through a Client(stage, address, index, shared): the clients below
// that fail, hold or note calls.
template <typename Client, typename Shared>
v1::JobStatus RunOverTwoStages(Shared* shared, const std::string& yaml) {
  InProcessCluster cluster(2);
  CoordinatorOptions options;
  options.stages = cluster.addresses();
  options.client_factory = [&](const std::string& address) -> std::unique_ptr<StageClient> {
    const int i = address == cluster.addresses()[1] ? 1 : 0;
    return std::make_unique<Client>(&cluster.stage(i), address, i, shared);
  };
  auto c = Coordinator::Start(options);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? RunToEnd(**c, yaml) : v1::JobStatus();
}

// Clients of two in-process stages for the order of Release after a failure:
// stage 1's third step call fails once after the stage ran it (its reply
// lost: a server that died and came straight back), and stage 0's Release holds until stage 1's Release has been called,
// as a survivor waiting in its replicas' all-reduce is freed only when the
// copy it waits for drops its group.
struct ReleaseOrder {
  std::mutex mu;
  std::condition_variable cv;
  bool released[2] = {false, false};
  bool freed_by_partner = false;
};

class ReleaseOrderClient : public TwoStageClient<ReleaseOrder> {
 public:
  using TwoStageClient::TwoStageClient;
#define CONVEYOR_STAGE_RELEASE_ORDER(Name, Request, Reply, Thread, How)                   \
  StatusOr<Reply> Name(const Request& request, double) override {                         \
    if (std::string_view(#Name) == "Release") BeforeRelease();                            \
    auto reply = stage_->Name(request);                                                   \
    if (std::string_view(#Name) == "Release") AfterRelease();                             \
    if (Fails(#Name)) return absl::UnavailableError(address_ + ": connection reset");     \
    return reply;                                                                         \
  }
  CONVEYOR_STAGE_CONTROL_OPS(CONVEYOR_STAGE_RELEASE_ORDER)
#undef CONVEYOR_STAGE_RELEASE_ORDER

 private:
  bool Fails(std::string_view name) { return index_ == 1 && name == "RunStep" && ++step_calls_ == 3; }
  void BeforeRelease() {
    if (index_ != 0) return;
    std::unique_lock<std::mutex> lock(shared_->mu);
    shared_->freed_by_partner = shared_->cv.wait_for(lock, std::chrono::seconds(30), [&] { return shared_->released[1]; });
  }
  void AfterRelease() {
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->released[index_] = true;
    shared_->cv.notify_all();
  }

  std::atomic<int> step_calls_{0};
};

// After a stage fails, the coordinator releases the survivors all at once: a
// survivor whose Release can only end after another stage's (it waits for
// that stage in a collective) is freed by it. One at a time, in stage order,
// stage 0's Release held until its deadline (5 s: the recovery wait of a
// replica-1 server's death, issue 32).
TEST(Coordinator, AfterAFailureTheSurvivorsAreReleasedTogether) {
  ReleaseOrder order;
  const v1::JobStatus s =
      RunOverTwoStages<ReleaseOrderClient>(&order, "model: toy\npartition: {stages: 2}\nbatch_size: 8\nsteps: 6\n");
  ASSERT_EQ(s.state(), v1::JOB_STATE_SUCCEEDED) << s.error();
  EXPECT_EQ(s.recoveries(), 1);
  std::lock_guard<std::mutex> lock(order.mu);
  EXPECT_TRUE(order.released[0] && order.released[1]);
  EXPECT_TRUE(order.freed_by_partner) << "stage 0's Release waited for its deadline: the releases were not concurrent";
}

// Clients of two in-process stages where the coordinator's Abort reaches
// stage 0 before the step it aborts: the first call of training step 2 on
// stage 1 fails without running, once stage 0's call of that step has begun;
// stage 0's call waits until stage 0 has been aborted, then runs. (Counted by
// calls, the step could be another: a call that begins after a stage failed
// is not made, and stage 0's third call was then the next run's first step.)
struct AbortFirst {
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<bool> held[2] = {false, false};  // each stage's call of step 2 was held
  bool stage0_waits = false;                  // stage 0's call of step 2 has begun
  bool aborted = false;
  Status late_step;  // stage 0's step 2, run after the abort
};

class AbortFirstClient : public TwoStageClient<AbortFirst> {
 public:
  using TwoStageClient::TwoStageClient;
#define CONVEYOR_STAGE_ABORT_FIRST(Name, Request, Reply, Thread, How)                         \
  StatusOr<Reply> Name(const Request& request, double) override {                             \
    const bool held = Holds(request);                                                         \
    if (held && index_ == 1) return FailOnceStage0Waits();                                    \
    if (held && index_ == 0) AwaitAbort();                                                    \
    auto reply = stage_->Name(request);                                                       \
    if (held && index_ == 0) NoteLateStep(reply.status());                                    \
    if (std::string_view(#Name) == "Abort" && index_ == 0) NoteAbort();                       \
    return reply;                                                                             \
  }
  CONVEYOR_STAGE_CONTROL_OPS(CONVEYOR_STAGE_ABORT_FIRST)
#undef CONVEYOR_STAGE_ABORT_FIRST

 private:
  // The first call of training step 2 (the run after the recovery steps it again).
  bool Holds(const v1::RunStepRequest& r) {
    return r.phase() == v1::PHASE_TRAIN && r.step() == 2 && !shared_->held[index_].exchange(true);
  }
  template <typename Request>
  bool Holds(const Request&) {
    return false;
  }
  Status FailOnceStage0Waits() {
    std::unique_lock<std::mutex> lock(shared_->mu);
    shared_->cv.wait_for(lock, std::chrono::seconds(30), [&] { return shared_->stage0_waits; });
    return absl::UnavailableError(address_ + ": connection reset");
  }
  void AwaitAbort() {
    std::unique_lock<std::mutex> lock(shared_->mu);
    shared_->stage0_waits = true;
    shared_->cv.notify_all();
    shared_->cv.wait_for(lock, std::chrono::seconds(30), [&] { return shared_->aborted; });
  }
  void NoteLateStep(const Status& st) {
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->late_step = st;
  }
  void NoteAbort() {
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->aborted = true;
    shared_->cv.notify_all();
  }
};

// An Abort that reaches a stage before the step it aborts has begun still
// aborts it: the step fails ABORTED at its first wait. Before, the step
// forgot it and waited for its neighbour until stage_timeout
// (DEADLINE_EXCEEDED), delaying the recovery by that much.
TEST(Coordinator, AnAbortThatComesBeforeItsStepAbortsIt) {
  AbortFirst shared;
  const v1::JobStatus s = RunOverTwoStages<AbortFirstClient>(
      &shared, "model: toy\npartition: {stages: 2}\nbatch_size: 8\nsteps: 6\nstage_timeout: 5\n");
  ASSERT_EQ(s.state(), v1::JOB_STATE_SUCCEEDED) << s.error();
  EXPECT_EQ(s.recoveries(), 1);
  std::lock_guard<std::mutex> lock(shared.mu);
  ASSERT_TRUE(shared.aborted);
  EXPECT_TRUE(absl::IsAborted(shared.late_step)) << shared.late_step;
}

// Clients of in-process stages that note the configuration number each
// Configure, RunStep and ApplyStep carries; stage 1's first call of training
// step 2 fails once without running, so that the job is configured twice.
struct Deployments {
  std::mutex mu;
  std::vector<int64_t> configured[2];  // each stage's, in order
  int calls = 0;                       // step and update calls
  int off = 0;                         // of them, with another number than their stage's last Configure
  std::atomic<bool> failed{false};
};

class DeploymentClient : public TwoStageClient<Deployments> {
 public:
  using TwoStageClient::TwoStageClient;
#define CONVEYOR_STAGE_DEPLOYMENTS(Name, Request, Reply, Thread, How)      \
  StatusOr<Reply> Name(const Request& request, double) override {          \
    Note(request);                                                         \
    if (Fails(request)) return absl::UnavailableError(address_ + ": reset"); \
    return stage_->Name(request);                                          \
  }
  CONVEYOR_STAGE_CONTROL_OPS(CONVEYOR_STAGE_DEPLOYMENTS)
#undef CONVEYOR_STAGE_DEPLOYMENTS

 private:
  void Note(const v1::StageAssignment& a) {
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->configured[index_].push_back(a.deployment());
  }
  void Note(const v1::RunStepRequest& r) { NoteCall(r.deployment()); }
  void Note(const v1::ApplyStepRequest& r) { NoteCall(r.deployment()); }
  template <typename Request>
  void Note(const Request&) {}
  void NoteCall(int64_t deployment) {
    std::lock_guard<std::mutex> lock(shared_->mu);
    ++shared_->calls;
    const auto& mine = shared_->configured[index_];
    if (mine.empty() || mine.back() != deployment) ++shared_->off;
  }
  bool Fails(const v1::RunStepRequest& r) {
    return index_ == 1 && r.phase() == v1::PHASE_TRAIN && r.step() == 2 && !shared_->failed.exchange(true);
  }
  template <typename Request>
  bool Fails(const Request&) {
    return false;
  }
};

// Each configuration of a job has a number greater than the one before it,
// and every step and update call carries its configuration's: a stage refuses
// a call of an earlier one (StageTest.CallsOfAnEarlierConfigurationAreRefused).
TEST(Coordinator, EachConfigurationHasAGreaterNumberThatItsCallsCarry) {
  Deployments shared;
  const v1::JobStatus s = RunOverTwoStages<DeploymentClient>(
      &shared, "model: toy\npartition: {stages: 2}\nbatch_size: 8\nsteps: 6\nclip_grad_norm: 1.0\n");
  ASSERT_EQ(s.state(), v1::JOB_STATE_SUCCEEDED) << s.error();
  EXPECT_EQ(s.recoveries(), 1);
  std::lock_guard<std::mutex> lock(shared.mu);
  for (const auto& numbers : shared.configured) {
    ASSERT_EQ(numbers.size(), 2u);
    EXPECT_GT(numbers[0], 0);
    EXPECT_GT(numbers[1], numbers[0]);
  }
  EXPECT_EQ(shared.configured[0], shared.configured[1]);
  EXPECT_GT(shared.calls, 12);  // steps and updates
  EXPECT_EQ(shared.off, 0);
}

// save.path: a second job that writes the file a queued or running job
// writes is refused at submission naming that job (they overwrote each
// other silently); once that job ended, the path is free again.
TEST(Coordinator, TwoJobsWritingOneSavePathAreRefusedAtSubmission) {
  InProcessCluster cluster(2);
  auto c = cluster.StartCoordinator();
  const std::string dir = std::filesystem::canonical(testing::MakeTempDir("save-twice")).string();
  const std::string job = "model: toy\npartition: {stages: 2}\nbatch_size: 8\nsave: {path: " + dir + "/w.pt}\n";
  auto first = c->Submit(job + "steps: 1000000\n");
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = c->Submit(job + "steps: 2\n");
  ASSERT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition) << second.status();
  EXPECT_THAT(std::string(second.status().message()), HasSubstr("save.path: " + *first));
  EXPECT_THAT(std::string(second.status().message()), HasSubstr(dir + "/w.pt too"));
  ASSERT_TRUE(c->Cancel(*first).ok());
  EXPECT_EQ(WaitForEnd(*c, *first).state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(RunToEnd(*c, job + "steps: 2\n").state(), v1::JOB_STATE_SUCCEEDED);
  RemoveTree(dir);
}

// A save that fails after training (here a file put where its folder was to
// be made) fails the job saying so, and the weights stay on the stages: the
// job's parameters can still be read, as `conveyor export` reads them. The
// job is queued behind a running one so that the file comes between its
// submission (whose check it passes) and its end.
TEST(Coordinator, ASaveThatFailsAfterTrainingKeepsTheWeightsOnTheStages) {
  InProcessCluster cluster(2);
  auto c = cluster.StartCoordinator();
  const std::string dir = std::filesystem::canonical(testing::MakeTempDir("save-fails")).string();
  auto blocker = c->Submit("model: toy\npartition: {stages: 2}\nbatch_size: 8\nsteps: 1000000\n");
  ASSERT_TRUE(blocker.ok()) << blocker.status();
  auto id = c->Submit("model: toy\npartition: {stages: 2}\nbatch_size: 8\nsteps: 3\nsave: {path: " + dir +
                      "/runs/w.pt}\n");
  ASSERT_TRUE(id.ok()) << id.status();
  std::ofstream(dir + "/runs") << "a file where the folder was to be";
  ASSERT_TRUE(c->Cancel(*blocker).ok());
  const v1::JobStatus s = WaitForEnd(*c, *id);
  ASSERT_EQ(s.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(s.error(), HasSubstr("save.path: cannot make the folder " + dir + "/runs"));
  EXPECT_THAT(s.error(), HasSubstr("its weights stay on the stage servers"));
  EXPECT_THAT(s.error(), HasSubstr("conveyor export " + *id));
  EXPECT_FALSE(cluster.Parameters(*id, 2).empty()) << "the stages still hold the trained job";
  RemoveTree(dir);
}

// A coordinator on a fake clock over an in-process cluster of `stages`
// stages, stage 1 of which goes away after training step 2, running `yaml`.
struct VanishingStageJob {
  VanishingStageJob(int stages, const std::string& yaml) : cluster(stages) {
    CoordinatorOptions options;
    options.stages = cluster.addresses();
    options.clock = &clock;
    options.client_factory = [this](const std::string& address) -> std::unique_ptr<StageClient> {
      int i = 0;
      while (cluster.addresses()[static_cast<std::size_t>(i)] != address) ++i;
      return std::make_unique<VanishingStageClient>(&cluster.stage(i), address, i == 1 ? 2 : -1);
    };
    auto c = Coordinator::Start(options);
    EXPECT_TRUE(c.ok()) << c.status();
    if (!c.ok()) return;
    coordinator = std::move(*c);
    auto submitted = coordinator->Submit(yaml);
    EXPECT_TRUE(submitted.ok()) << submitted.status();
    if (submitted.ok()) id = *submitted;
  }
  // The job's status once `done` holds for it (the fake time stands still:
  // these waits end on the job's changes alone).
  v1::JobStatus WaitFor(const std::function<bool(const v1::JobStatus&)>& done) {
    uint64_t version = 0;
    for (;;) {
      auto s = coordinator->Watch(id, &version, clock.After(3600), true);
      if (!s.ok() || done(*s)) return s.ok() ? *s : v1::JobStatus();
    }
  }
  // Waits until the job recovers, then lets `seconds` of fake time pass while
  // the runner waits for stage 1.
  void RecoverFor(int seconds) {
    const v1::JobStatus s = WaitFor([](const v1::JobStatus& s) {
      return s.state() == v1::JOB_STATE_RECOVERING || IsTerminal(s.state());
    });
    ASSERT_EQ(s.state(), v1::JOB_STATE_RECOVERING) << s.error();
    EXPECT_EQ(s.step(), 2);  // stage 1 went away after it ran step 2
    ASSERT_TRUE(clock.AwaitWaiters(1, std::chrono::seconds(30)));
    clock.Advance(std::chrono::seconds(seconds));
  }
  v1::JobStatus End() {
    return WaitFor([](const v1::JobStatus& s) { return IsTerminal(s.state()); });
  }

  InProcessCluster cluster;
  FakeClock clock;
  std::unique_ptr<Coordinator> coordinator;
  std::string id;
};

// recovery_timeout is decided by the coordinator's clock: a stage that goes
// away and never comes back fails the job with UNAVAILABLE naming it once the
// (fake) time passes recovery_timeout, in milliseconds of real time.
TEST(Coordinator, AStageThatDoesNotComeBackWithinRecoveryTimeoutFailsTheJobNamingIt) {
  const auto real_start = std::chrono::steady_clock::now();
  VanishingStageJob job(
      2, "model: toy\npartition: {stages: 2}\nbatch_size: 8\nsteps: 100\nrecovery_timeout: 600\non_lost_server: fail\n");
  ASSERT_TRUE(job.coordinator);
  job.RecoverFor(601);
  const v1::JobStatus s = job.End();
  EXPECT_EQ(s.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(s.error_code(), "UNAVAILABLE");
  EXPECT_THAT(s.error(), HasSubstr("stage 1 at " + job.cluster.addresses()[1] +
                                   " did not come back within recovery_timeout (600 s)"));
  EXPECT_LT(std::chrono::steady_clock::now() - real_start, std::chrono::seconds(5));
}

// A stage that goes away and does not answer within lost_after is lost for
// good: the job goes on over the other two (on_lost_server: replan, the
// default), from step 0 here (no checkpoints), and says what it lost.
TEST(Coordinator, AStageLostForGoodIsFoldedOntoTheOthersAndTheJobGoesOn) {
  VanishingStageJob job(
      3, "model: toy\npartition: {stages: 3}\nbatch_size: 8\nsteps: 6\nrecovery_timeout: 600\nlost_after: 30\n");
  ASSERT_TRUE(job.coordinator);
  job.RecoverFor(31);  // past lost_after, long before recovery_timeout
  const v1::JobStatus s = job.End();
  EXPECT_EQ(s.state(), v1::JOB_STATE_SUCCEEDED) << s.error();
  EXPECT_EQ(s.step(), 6);
  ASSERT_EQ(s.lost_servers_size(), 1);
  EXPECT_EQ(s.lost_servers(0), job.cluster.addresses()[1]);
  EXPECT_EQ(s.stages_size(), 2);
  std::string events;
  for (const auto& e : s.events()) events += e.text() + "\n";
  EXPECT_THAT(events, HasSubstr("stage 1 at " + job.cluster.addresses()[1]));
  EXPECT_THAT(events, HasSubstr("the job goes on over 2 stage server(s)"));
}

}  // namespace
}  // namespace conveyor
