// A stage server lost for good (docs/recovery.md, "A server lost for good"):
// real stage servers and a coordinator on loopback; servers are killed with
// SIGKILL and never started again. The job folds the lost server's stages
// onto the servers left, loads the newest complete checkpoint resharded (the
// lost server's files from the copies its neighbour kept), and ends at the
// param_digest of an uninterrupted run: each server left computes whole
// stages of the old cut, so nothing of the arithmetic changes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>

#include "cli/local_cluster.h"
#include "model/state_dict.h"
#include "plan/job_spec.h"
#include "tests/support/test_util.h"

namespace conveyor {
// Its own namespace: the tests are built four files to a compiler run, beside
// recovery_test.cpp's helpers of the same names.
namespace lost_server {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using Clock = std::chrono::steady_clock;

// Four stages of an MLP with AdamW, a warmup-then-cosine schedule, dynamic
// loss scaling and two batches a step, past an epoch: the optimizer state,
// the schedule's position, the loss scale and the data order must all come
// back. No clipping: the global norm would be summed over other shares once
// the stages are folded (the same value to rounding, not bit for bit).
constexpr char kFourStages[] = "partition: {stages: 4}\n";
constexpr char kTwoByTwo[] = "partition: {stages: 2}\nreplicas: 2\n";
// Two chunks a server, one layer a chunk (the MLP's 8 layers).
constexpr char kZbv[] = "partition: {stages: 4}\nschedule: zbv\n";
constexpr char kInterleaved[] = "partition: {stages: 4}\nschedule: interleaved\nvirtual_stages: 2\n";

std::string Job(int steps, const std::string& recovery = "recovery_timeout: 60\nlost_after: 1\n",
                const std::string& layout = kFourStages) {
  return "name: lost\nmodel: {name: mlp, input_dim: 32, hidden: [64, 64, 32]}\n" + layout +
         "data: {name: synthetic, train_samples: 2048}\nbatch_size: 16\naccumulate_steps: 2\nmicro_batches: 4\n" +
         (layout.find("schedule:") == std::string::npos ? "schedule: 1f1b\n" : "") +
         "optimizer: {name: adamw, lr: 0.001, weight_decay: 0.1, no_decay: [bias]}\n"
         "lr_schedule: {warmup_steps: 10, decay: cosine, min_lr: 0.0001}\n"
         "loss_scale: {dynamic: true, init: 1024, growth_interval: 7}\nseed: 5\nstage_timeout: 10\n"
         "checkpoint_every: 10\nsteps: " + std::to_string(steps) + "\n" + recovery;
}

// Four servers on loopback, none started again by a supervisor: a killed
// server stays dead.
std::unique_ptr<cli::LocalCluster> StartCluster() { return testing::StartCluster(4); }

std::string Events(const v1::JobStatus& s) {
  std::string out;
  for (const auto& e : s.events()) out += "  " + e.text() + "\n";
  return out;
}

const v1::JobStatus& Uninterrupted(int steps, const std::string& layout = kFourStages) {
  static std::map<std::pair<int, std::string>, v1::JobStatus> runs;
  const auto key = std::make_pair(steps, layout);
  if (!runs.count(key)) {
    auto cluster = StartCluster();
    EXPECT_TRUE(cluster);
    runs[key] = testing::SubmitAndWait(cluster->coordinator_address(), Job(steps, "", layout));
    EXPECT_EQ(runs[key].state(), v1::JOB_STATE_SUCCEEDED) << runs[key].error();
  }
  return runs[key];
}

void ExpectSameRun(const v1::JobStatus& end, const v1::JobStatus& clean) {
  EXPECT_EQ(end.state(), v1::JOB_STATE_SUCCEEDED) << end.error() << "\n" << Events(end);
  EXPECT_EQ(end.param_digest(), clean.param_digest()) << Events(end);
  ASSERT_EQ(end.losses_size(), clean.losses_size());
  for (int i = 0; i < end.losses_size(); ++i) EXPECT_EQ(end.losses(i), clean.losses(i)) << "step " << i;
}

// Every loss of `end` within `relative` of the same step's in `clean` (the
// same gradients summed in another order); returns the largest difference.
double ExpectLossesWithin(const v1::JobStatus& end, const v1::JobStatus& clean, double relative) {
  EXPECT_EQ(end.losses_size(), clean.losses_size());
  double worst = 0;
  for (int i = 0; i < std::min(end.losses_size(), clean.losses_size()); ++i) {
    const double rel = std::abs(end.losses(i) - clean.losses(i)) / std::max(1e-12, std::abs(double(clean.losses(i))));
    worst = std::max(worst, rel);
    EXPECT_LT(rel, relative) << "step " << i << ": " << end.losses(i) << " against " << clean.losses(i);
  }
  return worst;
}

// The kills: server `server` once the checkpoint of step `after` is complete.
struct Kill {
  int after;
  int server;
};

// Runs Job(steps) on a fresh cluster, killing servers as `kills` say, and
// returns its end; `seconds` receives, for each kill, the time from the kill
// to the job running again (a step done after it). A kill waits for a status
// of the job running after the last one, and statuses come ten a second at
// most: these jobs run hundreds of steps past their last kill's checkpoint,
// since a small job over few servers may train a hundred steps between two.
v1::JobStatus RunKilling(const std::string& job, const std::vector<Kill>& kills, std::vector<double>* seconds,
                         int servers = 4) {
  auto cluster = testing::StartCluster(servers);
  EXPECT_TRUE(cluster);
  if (!cluster) return v1::JobStatus();
  const std::string id = testing::Submit(cluster->coordinator_address(), job);
  std::size_t next = 0;
  Clock::time_point killed_at;
  int64_t step_at_kill = 0;
  bool waiting = false;
  v1::JobStatus end = testing::Follow(cluster->coordinator_address(), id, [&](const v1::JobStatus& s) {
    if (waiting && s.state() == v1::JOB_STATE_RUNNING && s.lost_servers_size() == static_cast<int>(next) &&
        s.step() > s.checkpoint_step() && s.step() != step_at_kill) {
      seconds->push_back(std::chrono::duration<double>(Clock::now() - killed_at).count());
      waiting = false;
    }
    if (!waiting && next < kills.size() && s.checkpoint_step() >= kills[next].after) {
      cluster->Signal(kills[next].server, SIGKILL);
      killed_at = Clock::now();
      step_at_kill = s.step();
      waiting = true;
      ++next;
    }
  });
  EXPECT_EQ(next, kills.size()) << "the job ended before every kill";
  return end;
}

TEST(LostServer, AStageServerLostForGoodIsFoldedOntoTheOthersAndTheRunEndsAtTheSameDigest) {
  const v1::JobStatus& clean = Uninterrupted(60);
  std::vector<double> seconds;
  const v1::JobStatus end = RunKilling(Job(60), {{20, 2}}, &seconds);
  ExpectSameRun(end, clean);
  ASSERT_EQ(end.lost_servers_size(), 1);
  EXPECT_EQ(end.stages_size(), 3) << "went on over the three servers left";
  EXPECT_THAT(Events(end), HasSubstr("lost for good"));
  EXPECT_THAT(Events(end), HasSubstr("the job goes on over 3 stage server(s)"));
  EXPECT_THAT(Events(end), HasSubstr("restored every stage from the checkpoint of step"));
  for (double s : seconds) std::printf("from the kill to training again on the servers left: %.2f s\n", s);
}

// Servers die one after another, never coming back, until one is left; each
// time the job folds onto the survivors and reads the lost server's
// checkpoint from the copy another server kept. Nothing is lost.
TEST(LostServer, ServersKilledOneAfterAnotherUntilOneIsLeftEndAtTheSameDigest) {
  const v1::JobStatus& clean = Uninterrupted(300);
  std::vector<double> seconds;
  const v1::JobStatus end = RunKilling(Job(300), {{20, 1}, {40, 3}, {60, 0}}, &seconds);
  ExpectSameRun(end, clean);
  EXPECT_EQ(end.lost_servers_size(), 3);
  EXPECT_EQ(end.stages_size(), 1) << "the last server holds the whole model";
  for (double s : seconds) std::printf("from a kill to training again on the servers left: %.2f s\n", s);
}

// 2 x 2: a server of replica 1 is lost, and the job goes on as one pipeline
// taking the whole global batch (the same gradients, summed in another
// order); then one of its two servers is lost, and the job folds onto the
// last. The losses stay those of the uninterrupted 2 x 2 run to float
// rounding.
TEST(LostServer, ATwoByTwoJobDropsAReplicaThenFoldsOntoTheLastServer) {
  const v1::JobStatus& clean = Uninterrupted(300, kTwoByTwo);
  std::vector<double> seconds;
  const v1::JobStatus end =
      RunKilling(Job(300, "recovery_timeout: 60\nlost_after: 1\n", kTwoByTwo), {{20, 2}, {40, 1}}, &seconds);
  EXPECT_EQ(end.state(), v1::JOB_STATE_SUCCEEDED) << end.error() << "\n" << Events(end);
  EXPECT_EQ(end.lost_servers_size(), 2) << Events(end);
  EXPECT_EQ(end.stages_size(), 1);
  EXPECT_THAT(Events(end), HasSubstr("the job goes on as 1 replica(s) of 2 stages"));
  EXPECT_THAT(Events(end), HasSubstr("the steps since are redone; commit_steps: true keeps them"));
  std::printf("largest relative difference of a loss from the uninterrupted 2 x 2 run: %.3g\n",
              ExpectLossesWithin(end, clean, 1e-6));
  for (double s : seconds) std::printf("from a kill to training again on the servers left: %.2f s\n", s);
}

// zbv places two chunks on each server in a V: servers lost one after
// another until one is left, each time the chunks are merged into as many
// as two a server left and the V is kept. Every new chunk holds whole old
// chunks: the run ends at the uninterrupted run's digest, bit for bit.
TEST(LostServer, AZbvJobKeepsItsVOverTheServersLeftToTheSameDigest) {
  const v1::JobStatus& clean = Uninterrupted(300, kZbv);
  std::vector<double> seconds;
  const v1::JobStatus end =
      RunKilling(Job(300, "recovery_timeout: 60\nlost_after: 1\n", kZbv), {{20, 1}, {40, 3}, {60, 0}}, &seconds);
  ExpectSameRun(end, clean);
  EXPECT_EQ(end.lost_servers_size(), 3);
  ASSERT_EQ(end.stages_size(), 1);
  EXPECT_EQ(end.stages(0).chunks_size(), 2) << "the last server holds the V's two chunks";
  for (double s : seconds) std::printf("from a kill to training again on the servers left: %.2f s\n", s);
}

// Interleaved over 4 servers with 4 micro-batches: over 3 the micro-batches
// no longer divide, and the job goes on as 1F1B, saying so; the same
// gradients, accumulated in the same order, so the same losses to rounding.
TEST(LostServer, AnInterleavedJobGoesOnAs1F1BWhereItsMicroBatchesNoLongerDivide) {
  const v1::JobStatus& clean = Uninterrupted(60, kInterleaved);
  std::vector<double> seconds;
  const v1::JobStatus end =
      RunKilling(Job(60, "recovery_timeout: 60\nlost_after: 1\n", kInterleaved), {{20, 2}}, &seconds);
  EXPECT_EQ(end.state(), v1::JOB_STATE_SUCCEEDED) << end.error() << "\n" << Events(end);
  EXPECT_EQ(end.stages_size(), 3);
  EXPECT_THAT(Events(end), HasSubstr("it goes on as 1f1b, one chunk a stage server"));
  std::printf("largest relative difference of a loss from the uninterrupted interleaved run: %.3g\n",
              ExpectLossesWithin(end, clean, 1e-6));
  for (double s : seconds) std::printf("from the kill to training again on the servers left: %.2f s\n", s);
}

// The step the first failure happened at, and the step the job went on from
// after it ("step N failed ...", "restored every stage from the checkpoint of
// step N"); -1 where the events have none.
std::pair<int64_t, int64_t> FailedAndRestoredSteps(const v1::JobStatus& s) {
  int64_t failed = -1, restored = -1;
  for (const auto& e : s.events()) {
    long long n = 0;
    if (failed < 0 && std::sscanf(e.text().c_str(), "step %lld failed", &n) == 1) failed = n;
    if (failed >= 0 && restored < 0 &&
        std::sscanf(e.text().c_str(), "restored every stage from the checkpoint of step %lld", &n) == 1)
      restored = n;
  }
  return {failed, restored};
}

// commit_steps: a server of replica 1 is lost five steps past the newest
// checkpoint. Replica 0 is whole after the last committed step: it writes
// that state as a checkpoint and the job goes on from it as one pipeline,
// redoing only the step that failed (without commit_steps, every step since
// the checkpoint). The losses stay those of the uninterrupted 2 x 2 run to
// float rounding.
TEST(LostServer, WithCommittedStepsALostReplicaCostsOnlyTheStepThatFailed) {
  const v1::JobStatus& clean = Uninterrupted(60, kTwoByTwo);
  auto cluster = StartCluster();
  ASSERT_TRUE(cluster);
  const std::string id = testing::Submit(cluster->coordinator_address(),
                                         Job(60, "recovery_timeout: 60\nlost_after: 1\ncommit_steps: true\n", kTwoByTwo));
  bool killed = false;
  Clock::time_point killed_at;
  double seconds = -1;  // from the kill to a step trained on the replica left
  int64_t step_at_kill = 0;
  const v1::JobStatus end = testing::Follow(cluster->coordinator_address(), id, [&](const v1::JobStatus& s) {
    if (!killed && s.checkpoint_step() >= 20 && s.step() >= 25) {
      killed = true;
      killed_at = Clock::now();
      step_at_kill = s.step();
      cluster->Signal(2, SIGKILL);  // replica 1's first stage
    }
    if (killed && seconds < 0 && s.lost_servers_size() == 1 && s.state() == v1::JOB_STATE_RUNNING &&
        s.step() > step_at_kill + 1)
      seconds = std::chrono::duration<double>(Clock::now() - killed_at).count();
  });
  ASSERT_TRUE(killed) << "the job ended before the kill";
  EXPECT_EQ(end.state(), v1::JOB_STATE_SUCCEEDED) << end.error() << "\n" << Events(end);
  EXPECT_EQ(end.lost_servers_size(), 1);
  EXPECT_THAT(Events(end), HasSubstr("replica 0 kept its state after step"));
  EXPECT_THAT(Events(end), HasSubstr("with a checkpoint at its next step for a copy on another server"));
  const auto [failed, restored] = FailedAndRestoredSteps(end);
  ASSERT_GE(failed, 25) << Events(end);
  EXPECT_GE(restored, failed) << "went back past the step that failed:\n" << Events(end);
  ExpectLossesWithin(end, clean, 1e-6);
  std::printf("step %lld failed; the job went on from step %lld, training again %.2f s after the kill\n",
              static_cast<long long>(failed), static_cast<long long>(restored), seconds);
}

// Three replicas of two stages, with commit_steps: a server of replica 1 is
// lost, and the job goes on as two replicas (24 samples a step, 12 each) from
// the state after the step before the one that failed.
TEST(LostServer, ThreeReplicasGoOnAsTwoFromTheirCommittedState) {
  auto three = [](const std::string& recovery) {
    std::string job = Job(40, recovery, "partition: {stages: 2}\nreplicas: 3\n");
    job.replace(job.find("batch_size: 16"), 14, "batch_size: 24");
    return job;
  };
  auto cluster = testing::StartCluster(6);
  ASSERT_TRUE(cluster);
  const v1::JobStatus clean = testing::SubmitAndWait(cluster->coordinator_address(), three(""));
  ASSERT_EQ(clean.state(), v1::JOB_STATE_SUCCEEDED) << clean.error();
  const std::string id =
      testing::Submit(cluster->coordinator_address(), three("recovery_timeout: 60\nlost_after: 1\ncommit_steps: true\n"));
  bool killed = false;
  const v1::JobStatus end = testing::Follow(cluster->coordinator_address(), id, [&](const v1::JobStatus& s) {
    if (!killed && s.step() >= 15) {
      killed = true;
      cluster->Signal(3, SIGKILL);  // replica 1's second stage
    }
  });
  ASSERT_TRUE(killed) << "the job ended before the kill";
  EXPECT_EQ(end.state(), v1::JOB_STATE_SUCCEEDED) << end.error() << "\n" << Events(end);
  EXPECT_THAT(Events(end), HasSubstr("the job goes on as 2 replica(s) of 2 stages"));
  EXPECT_EQ(end.stages_size(), 4);
  const auto [failed, restored] = FailedAndRestoredSteps(end);
  EXPECT_GE(restored, failed) << Events(end);
  ExpectLossesWithin(end, clean, 1e-6);
}

// `conveyor export --checkpoint-dir` after a re-plan: the folders of the
// servers left hold the newest checkpoints under the 3-server cut, and the
// older ones under the planned 4-stage cut, the lost server's files as the
// copies its neighbour kept. The newest equals the running job's export;
// the older step is read under its own cut.
TEST(LostServer, ExportReadsACheckpointOfEitherCutFromTheServersLeft) {
  auto cluster = StartCluster();
  ASSERT_TRUE(cluster);
  const std::string addr = cluster->coordinator_address();
  const std::string id = testing::Submit(addr, Job(40));
  bool killed = false;
  const v1::JobStatus end = testing::Follow(addr, id, [&](const v1::JobStatus& s) {
    if (!killed && s.checkpoint_step() >= 20) {
      killed = true;
      cluster->Signal(2, SIGKILL);
    }
  });
  ASSERT_EQ(end.state(), v1::JOB_STATE_SUCCEEDED) << end.error() << "\n" << Events(end);
  ASSERT_EQ(end.stages_size(), 3);
  const testing::ScopedTempDir out("lost-export");
  auto r = testing::RunCommand({testing::Binary("conveyor"), "--coordinator", addr, "export", id, "--out",
                                out.path() + "/live.pt"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<std::string> files = {testing::Binary("conveyor"), "export"};
  for (int s : {0, 1, 3}) {
    files.push_back("--checkpoint-dir");
    files.push_back(cluster->run_dir() + "/stage-" + std::to_string(s) + "/checkpoints");
  }
  auto newest = files, older = files;
  newest.insert(newest.end(), {"--out", out.path() + "/newest.pt"});
  r = testing::RunCommand(newest);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("at step 40 from the checkpoints of 3 stage(s)"));
  auto want = ReadStateDict(out.path() + "/live.pt");
  auto got = ReadStateDict(out.path() + "/newest.pt");
  ASSERT_TRUE(want.ok()) << want.status();
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), want->size());
  for (std::size_t i = 0; i < want->size(); ++i) {
    EXPECT_EQ((*got)[i].first, (*want)[i].first);
    EXPECT_TRUE(at::equal((*got)[i].second, (*want)[i].second)) << (*want)[i].first;
  }
  older.insert(older.end(), {"--out", out.path() + "/older.pt", "--step", "20"});
  r = testing::RunCommand(older);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("at step 20 from the checkpoints of 4 stage(s)"));
}

// zero 1 over three replicas of two stages: each replica holds a third of
// each stage's optimizer state, and a checkpoint holds it whole, by
// parameter. Replica 0's first server is lost: the two replicas left load
// that checkpoint (stage 0's file from the copy a dropped server keeps) and
// slice its state in halves; then a server of one of them is lost, and the
// last replica takes all of it. The losses stay those of the uninterrupted
// run to float rounding.
TEST(LostServer, ZeroOneReplicasAreDroppedAndTheirOptimizerStateResliced) {
  const std::string layout = "partition: {stages: 2}\nreplicas: 3\nzero: 1\nbucket_cap_mb: 0.0078125\n";
  auto three = [&](const std::string& recovery) {
    std::string job = Job(200, recovery, layout);
    job.replace(job.find("batch_size: 16"), 14, "batch_size: 24");
    return job;
  };
  v1::JobStatus clean;
  {
    auto cluster = testing::StartCluster(6);
    ASSERT_TRUE(cluster);
    clean = testing::SubmitAndWait(cluster->coordinator_address(), three(""));
    ASSERT_EQ(clean.state(), v1::JOB_STATE_SUCCEEDED) << clean.error();
  }
  std::vector<double> seconds;
  const v1::JobStatus end =
      RunKilling(three("recovery_timeout: 60\nlost_after: 1\n"), {{10, 0}, {30, 5}}, &seconds, /*servers=*/6);
  EXPECT_EQ(end.state(), v1::JOB_STATE_SUCCEEDED) << end.error() << "\n" << Events(end);
  EXPECT_THAT(Events(end), HasSubstr("the job goes on as 2 replica(s) of 2 stages"));
  EXPECT_THAT(Events(end), HasSubstr("the job goes on as 1 replica(s) of 2 stages"));
  EXPECT_THAT(Events(end), Not(HasSubstr("starts again from step 0")));
  EXPECT_EQ(end.stages_size(), 2);
  const auto [failed, restored] = FailedAndRestoredSteps(end);
  EXPECT_GE(restored, 10) << "went back past the checkpoint:\n" << Events(end);
  std::printf("largest relative difference of a loss from the uninterrupted 3 x 2 run: %.3g\n",
              ExpectLossesWithin(end, clean, 1e-6));
  for (double s : seconds) std::printf("from a kill to training again on the servers left: %.2f s\n", s);
}

// Grow back: the lost server is started again at its address (as a node
// comes back); at the next checkpoint the job returns to its four servers,
// loading that checkpoint resharded onto its planned cut, and still ends at
// the uninterrupted run's digest.
TEST(LostServer, AServerThatComesBackIsTakenBackAtTheNextCheckpoint) {
  // Long enough that checkpoints come after the server serves again (its
  // start, LibTorch's load among it, takes seconds while the job goes on).
  const v1::JobStatus& clean = Uninterrupted(300);
  auto cluster = StartCluster();
  ASSERT_TRUE(cluster);
  const std::string id = testing::Submit(cluster->coordinator_address(), Job(300));
  bool killed = false, restarted = false;
  const v1::JobStatus end = testing::Follow(cluster->coordinator_address(), id, [&](const v1::JobStatus& s) {
    if (!killed && s.checkpoint_step() >= 20) {
      killed = true;
      cluster->Signal(2, SIGKILL);
    }
    if (killed && !restarted && s.lost_servers_size() == 1 && s.state() == v1::JOB_STATE_RUNNING) {
      restarted = true;
      EXPECT_TRUE(cluster->RestartStage(2).ok());
    }
  });
  ASSERT_TRUE(restarted);
  ExpectSameRun(end, clean);
  EXPECT_EQ(end.lost_servers_size(), 0);
  EXPECT_EQ(end.stages_size(), 4);
  EXPECT_THAT(Events(end), HasSubstr("answer again: the job returns from 3 to its planned 4 stage servers"));
}

// By hand: a cancelled 4-stage job resumed as 2 stages (`conveyor resume
// --set partition.stages=2`) loads its checkpoint resharded and ends at the
// uninterrupted run's digest; an override that changes the training is
// refused before anything runs.
TEST(LostServer, AJobResumedOnAnotherPartitionLoadsItsCheckpointReshardedToTheSameDigest) {
  // Long enough that the cancel (a process of its own) lands before the end.
  const v1::JobStatus& clean = Uninterrupted(300);
  auto cluster = StartCluster();
  ASSERT_TRUE(cluster);
  const std::string addr = cluster->coordinator_address();
  const std::string id = testing::Submit(addr, Job(300));
  bool asked = false;
  v1::JobStatus end = testing::Follow(addr, id, [&](const v1::JobStatus& s) {
    if (!asked && s.checkpoint_step() >= 20) {
      asked = true;
      testing::RunCommand({testing::Binary("conveyor"), "--coordinator", addr, "cancel", s.job_id()});
    }
  });
  ASSERT_EQ(end.state(), v1::JOB_STATE_CANCELLED) << end.error();
  auto resume = [&](const std::string& set) {
    return testing::RunCommand({testing::Binary("conveyor"), "--coordinator", addr, "resume", id, "--set", set, "--wait"});
  };
  testing::CommandResult r = resume("seed=9");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("INVALID_ARGUMENT"));
  EXPECT_THAT(r.err, HasSubstr("changes how job " + id + " trains"));
  r = resume("partition.stages=2");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("with partition.stages=2 (its checkpoint is loaded resharded)"));
  end = testing::Follow(addr, id);
  ExpectSameRun(end, clean);
  EXPECT_EQ(end.stages_size(), 2);
}

// A 2 x 2 job with zero 1, cancelled and resumed as one replica without
// zero, then cancelled again and resumed as 2 x 2 with zero 1: its
// checkpoints hold each stage's optimizer state whole, by parameter, so the
// one copy takes all of it and two copies slice it anew. The same gradients
// summed in another order: the losses to rounding.
TEST(LostServer, AZeroOneJobResumesAsOneReplicaWithoutZeroAndBack) {
  const std::string layout = "partition: {stages: 2}\nreplicas: 2\nzero: 1\nbucket_cap_mb: 0.0078125\n";
  const v1::JobStatus& clean = Uninterrupted(300, layout);
  auto cluster = StartCluster();
  ASSERT_TRUE(cluster);
  const std::string addr = cluster->coordinator_address();
  auto cancel_after = [&](const std::string& id, int64_t checkpoint) {
    bool asked = false;
    return testing::Follow(addr, id, [&](const v1::JobStatus& s) {
      if (!asked && s.checkpoint_step() >= checkpoint) {
        asked = true;
        testing::RunCommand({testing::Binary("conveyor"), "--coordinator", addr, "cancel", s.job_id()});
      }
    });
  };
  auto resume = [&](const std::string& id, const std::string& replicas, const std::string& zero) {
    return testing::RunCommand({testing::Binary("conveyor"), "--coordinator", addr, "resume", id, "--set",
                                "replicas=" + replicas, "--set", "zero=" + zero});
  };
  const std::string id = testing::Submit(addr, Job(300, "", layout));
  v1::JobStatus end = cancel_after(id, 20);
  ASSERT_EQ(end.state(), v1::JOB_STATE_CANCELLED) << end.error();
  testing::CommandResult r = resume(id, "1", "0");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  end = cancel_after(id, end.checkpoint_step() + 20);
  ASSERT_EQ(end.state(), v1::JOB_STATE_CANCELLED) << end.error();
  EXPECT_EQ(end.stages_size(), 2) << "one replica";
  r = resume(id, "2", "1");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  end = testing::Follow(addr, id);
  EXPECT_EQ(end.state(), v1::JOB_STATE_SUCCEEDED) << end.error() << "\n" << Events(end);
  EXPECT_EQ(end.stages_size(), 4);
  EXPECT_THAT(Events(end), Not(HasSubstr("starts again from step 0")));
  std::printf("largest relative difference of a loss from the uninterrupted 2 x 2 run: %.3g\n",
              ExpectLossesWithin(end, clean, 1e-6));
}

// on_lost_server: fail keeps the old rule: the job fails naming the server.
TEST(LostServer, OnLostServerFailFailsTheJobNamingTheServer) {
  auto cluster = StartCluster();
  ASSERT_TRUE(cluster);
  const std::string id = testing::Submit(cluster->coordinator_address(), Job(100000, "on_lost_server: fail\nrecovery_timeout: 1\n"));
  bool killed = false;
  const v1::JobStatus end = testing::Follow(cluster->coordinator_address(), id, [&](const v1::JobStatus& s) {
    if (!killed && s.step() >= 5) {
      killed = true;
      cluster->Signal(3, SIGKILL);
    }
  });
  EXPECT_EQ(end.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(end.error(), HasSubstr("stage 3 at " + cluster->stage_addresses()[3]));
  EXPECT_THAT(end.error(), HasSubstr("on_lost_server: fail"));
}

}  // namespace
}  // namespace lost_server
}  // namespace conveyor
