// Nothing lost: real stage servers and a coordinator on loopback, killed with
// SIGKILL in the middle of steps and of checkpoint writes, restarted at their
// addresses; the job ends with the param_digest of an uninterrupted run.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <random>
#include <tuple>

#include "cli/local_cluster.h"
#include "common/files.h"
#include "plan/job_spec.h"
#include "common/net.h"
#include "conveyor.grpc.pb.h"
#include "stage_server/replica_group.h"
#include "tests/support/test_util.h"

namespace conveyor {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

// Small enough to run hundreds of steps in seconds on 2 cores; issue 18's
// recipe (AdamW with parameter groups, warmup then cosine, clipping by the
// global norm over the 4 stages, two batches a step, dynamic loss scaling
// with overflows injected on three stages), so that optimizer state, the
// schedule's position and the loss scale must come back too; past an epoch,
// so the data order does.
std::string Job(int steps, int checkpoint_every, double recovery_timeout = 60, int replicas = 1, int zero = 0,
                const std::string& extra = "") {
  // 4 stage servers either way: one pipeline of 4 stages, or 2 replicas of 2.
  const bool grid = replicas > 1;
  return std::string("name: chaos\nmodel: {name: mlp, input_dim: 32, hidden: [64, 64, 32]}\n") +
         (grid ? "partition: {stages: 2}\nreplicas: 2\n" : "partition: {stages: 4}\n") +
         "data: {name: synthetic, train_samples: 2048}\nbatch_size: 16\naccumulate_steps: 2\nmicro_batches: " +
         (grid ? "2" : "4") +
         "\nschedule: 1f1b\noptimizer: {name: adamw, lr: 0.001, weight_decay: 0.1, no_decay: [bias]}\n"
         "lr_schedule: {warmup_steps: 10, decay: cosine, min_lr: 0.0001}\nclip_grad_norm: 0.5\n"
         "loss_scale: {dynamic: true, init: 1024, growth_interval: 7}\n" +
         (grid ? "inject_inf_gradients: [{stage: 1, step: 12}, {stage: 0, step: 13}, {stage: 1, step: 47}]\n"
               : "inject_inf_gradients: [{stage: 3, step: 12}, {stage: 0, step: 13}, {stage: 2, step: 47}]\n") +
         "seed: 5\nstage_timeout: 10\nsteps: " + std::to_string(steps) +
         "\ncheckpoint_every: " + std::to_string(checkpoint_every) +
         "\nrecovery_timeout: " + std::to_string(recovery_timeout) + "\n" + (zero > 0 ? "zero: 1\n" : "") + extra;
}

std::unique_ptr<cli::LocalCluster> StartCluster(bool restart_stages,
                                                std::vector<std::pair<int, std::string>> env = {}) {
  cli::LocalClusterOptions options;
  options.remove_run_dir = true;
  options.stages = 4;
  options.bin_dir = CONVEYOR_BIN_DIR;
  options.restart_stages = restart_stages;
  options.first_start_env = std::move(env);
  auto cluster = cli::LocalCluster::Start(options);
  EXPECT_TRUE(cluster.ok()) << cluster.status();
  return cluster.ok() ? std::move(*cluster) : nullptr;
}

std::string Events(const v1::JobStatus& s) {
  std::string out;
  for (const auto& e : s.events()) out += "  " + e.text() + "\n";
  return out;
}

// Follows job `id` to its end; the first time `when` holds for its status,
// kills the coordinator (SIGKILL) and starts it again. `killed` says whether
// that happened.
v1::JobStatus FollowKillingTheCoordinator(cli::LocalCluster& cluster, const std::string& id,
                                          const std::function<bool(const v1::JobStatus&)>& when, bool* killed) {
  *killed = false;
  return testing::Follow(cluster.coordinator_address(), id, [&](const v1::JobStatus& s) {
    if (!*killed && when(s)) {
      *killed = true;
      cluster.Signal(-1, SIGKILL);
      ASSERT_TRUE(cluster.RestartCoordinator().ok());
    }
  });
}

// One run of the job with nothing going wrong: what every other run must end at.
const v1::JobStatus& Uninterrupted(int steps, int checkpoint_every, int replicas = 1, int zero = 0) {
  static std::map<std::tuple<int, int, int, int>, v1::JobStatus> runs;
  auto key = std::make_tuple(steps, checkpoint_every, replicas, zero);
  if (!runs.count(key)) {
    auto cluster = StartCluster(false);
    EXPECT_TRUE(cluster);
    runs[key] =
        testing::SubmitAndWait(cluster->coordinator_address(), Job(steps, checkpoint_every, 60, replicas, zero));
    EXPECT_EQ(runs[key].state(), v1::JOB_STATE_SUCCEEDED) << runs[key].error();
  }
  return runs[key];
}

TEST(Recovery, CoordinatorKilledMidJobResumesToTheSameDigest) {
  const v1::JobStatus& clean = Uninterrupted(80, 10);
  auto cluster = StartCluster(false);
  ASSERT_TRUE(cluster);
  const std::string id = testing::Submit(cluster->coordinator_address(), Job(80, 10));
  bool killed = false;
  v1::JobStatus end = FollowKillingTheCoordinator(
      *cluster, id, [](const v1::JobStatus& s) { return s.checkpoint_step() >= 20; }, &killed);
  ASSERT_TRUE(killed);
  EXPECT_EQ(end.state(), v1::JOB_STATE_SUCCEEDED) << end.error() << "\n" << Events(end);
  EXPECT_EQ(end.param_digest(), clean.param_digest());
  // Every step's loss, the ones before the restart and the ones after.
  ASSERT_EQ(end.losses_size(), clean.losses_size());
  for (int i = 0; i < end.losses_size(); ++i) EXPECT_EQ(end.losses(i), clean.losses(i)) << "step " << i;
  // The schedule went on where it stopped, and so did the clipped norms.
  ASSERT_EQ(end.lrs_size(), clean.lrs_size());
  ASSERT_EQ(end.grad_norms_size(), clean.grad_norms_size());
  for (int i = 0; i < end.lrs_size(); ++i) {
    EXPECT_EQ(end.lrs(i), clean.lrs(i)) << "step " << i;
    if (std::isfinite(clean.grad_norms(i))) EXPECT_EQ(end.grad_norms(i), clean.grad_norms(i)) << "step " << i;
    else EXPECT_FALSE(std::isfinite(end.grad_norms(i))) << "step " << i << " was skipped";
  }
  // The loss scale too, replayed across the restart: the three overflows
  // skipped their steps, each halving the scale, which grew back.
  ASSERT_EQ(end.loss_scales_size(), clean.loss_scales_size());
  for (int i = 0; i < end.loss_scales_size(); ++i) EXPECT_EQ(end.loss_scales(i), clean.loss_scales(i)) << "step " << i;
  EXPECT_EQ(clean.loss_scales(12), 1024 * 2);  // grown after 7 finite steps (0-6), not after 12 (a skip at 12)
  EXPECT_EQ(clean.loss_scales(14), 1024 / 2);
  EXPECT_FALSE(std::isfinite(clean.grad_norms(47)));
  EXPECT_THAT(Events(end), HasSubstr("coordinator restarted"));
  EXPECT_THAT(Events(end), HasSubstr("restored every stage from the checkpoint of step"));
}

// A job given in epochs, evaluated after each, whose coordinator dies once
// the first epoch is reported: it resumes from the checkpoint at that epoch's
// end and reports every epoch once, with the uninterrupted run's accuracies.
TEST(Recovery, EpochsAreReportedOnceAcrossACoordinatorRestart) {
  const std::string job =
      "name: epochs\nmodel: {name: mlp, input_dim: 32, hidden: [64, 32]}\npartition: {stages: 4}\n"
      "data: {name: synthetic, train_samples: 640, test_samples: 256}\nbatch_size: 32\nmicro_batches: 4\n"
      "schedule: 1f1b\noptimizer: {name: adam, lr: 0.001}\nseed: 5\nstage_timeout: 10\nepochs: 3\neval: true\n"
      "checkpoint_every: 20\n";
  v1::JobStatus clean;
  {
    auto cluster = StartCluster(false);
    ASSERT_TRUE(cluster);
    clean = testing::SubmitAndWait(cluster->coordinator_address(), job);
    ASSERT_EQ(clean.state(), v1::JOB_STATE_SUCCEEDED) << clean.error();
  }
  auto cluster = StartCluster(false);
  ASSERT_TRUE(cluster);
  const std::string id = testing::Submit(cluster->coordinator_address(), job);
  bool killed = false;
  v1::JobStatus end = FollowKillingTheCoordinator(
      *cluster, id, [](const v1::JobStatus& s) { return s.epochs_size() >= 1; }, &killed);
  ASSERT_TRUE(killed);
  ASSERT_EQ(end.state(), v1::JOB_STATE_SUCCEEDED) << end.error() << "\n" << Events(end);
  ASSERT_EQ(clean.epochs_size(), 3);
  ASSERT_EQ(end.epochs_size(), 3) << Events(end);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(end.epochs(i).epoch(), i + 1);
    ASSERT_TRUE(end.epochs(i).has_eval()) << "epoch " << i + 1;
    EXPECT_EQ(end.epochs(i).eval_accuracy(), clean.epochs(i).eval_accuracy()) << "epoch " << i + 1;
    EXPECT_EQ(end.epochs(i).mean_loss(), clean.epochs(i).mean_loss()) << "epoch " << i + 1;
  }
  EXPECT_EQ(end.param_digest(), clean.param_digest());
}

// A scheduler's warning before preemption (Slurm's --signal; deploy/slurm):
// SIGUSR1 to the coordinator checkpoints the running job after its step in
// flight, though checkpoint_every is far off; a coordinator started again with
// its state (as a requeued batch job starts one) resumes from that checkpoint.
TEST(Recovery, SigusrOneCheckpointsTheRunningJobAndARestartResumesFromIt) {
  auto cluster = StartCluster(false);
  ASSERT_TRUE(cluster);
  const std::string address = cluster->coordinator_address();
  const std::string id = testing::Submit(address, Job(100000, 100000));
  int64_t signalled_at = -1, checkpoint = 0;
  bool restarted = false, cancelled = false;
  std::string events_before;
  v1::JobStatus end = testing::Follow(address, id, [&](const v1::JobStatus& s) {
    if (signalled_at < 0 && s.step() >= 3) {
      signalled_at = s.step();
      cluster->Signal(-1, SIGUSR1);
    } else if (signalled_at >= 0 && !restarted && s.checkpoint_step() > 0) {
      checkpoint = s.checkpoint_step();
      events_before = Events(s);
      restarted = true;
      cluster->Signal(-1, SIGKILL);
      ASSERT_TRUE(cluster->RestartCoordinator().ok());
    } else if (!cancelled && ((restarted && s.step() > checkpoint) ||
                              (!restarted && signalled_at >= 0 && s.step() > signalled_at + 500))) {
      // Resumed and went on; or no checkpoint came (the test fails below).
      cancelled = true;
      auto r = testing::RunCommand({testing::Binary("conveyor"), "--coordinator", address, "cancel", id});
      EXPECT_EQ(r.exit_code, 0) << r.err;
    }
  });
  ASSERT_TRUE(restarted) << "no checkpoint after SIGUSR1: " << end.error() << "\n" << Events(end);
  EXPECT_GT(checkpoint, signalled_at);
  EXPECT_LT(checkpoint, 100000);
  EXPECT_THAT(events_before, HasSubstr("checkpoint of step " + std::to_string(checkpoint) +
                                       " taken on request (the coordinator got SIGUSR1)"));
  EXPECT_EQ(end.state(), v1::JOB_STATE_CANCELLED) << end.error() << "\n" << Events(end);
  EXPECT_THAT(Events(end), HasSubstr("restored every stage from the checkpoint of step " + std::to_string(checkpoint)));
}

TEST(Recovery, AStageThatDoesNotComeBackFailsTheJobNamingIt) {
  auto cluster = StartCluster(/*restart_stages=*/false);
  ASSERT_TRUE(cluster);
  // on_lost_server: fail (without it the job goes on over the other three: lost_server_test.cpp).
  const std::string id = testing::Submit(cluster->coordinator_address(),
                                         Job(100000, 10, /*recovery_timeout=*/2, 1, 0, "on_lost_server: fail\n"));
  bool killed = false, recovering = false;
  v1::JobStatus end = testing::Follow(cluster->coordinator_address(), id, [&](const v1::JobStatus& s) {
    if (!killed && s.step() >= 5) {
      killed = true;
      cluster->Signal(1, SIGKILL);
    }
    recovering |= s.state() == v1::JOB_STATE_RECOVERING;
  });
  EXPECT_TRUE(recovering);
  EXPECT_EQ(end.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(end.error(), HasSubstr("stage 1 at " + cluster->stage_addresses()[1]));
  EXPECT_THAT(end.error(), HasSubstr("did not come back within recovery_timeout"));
}

TEST(Recovery, ACorruptCheckpointIsSkippedForThePreviousOne) {
  const v1::JobStatus& clean = Uninterrupted(120, 10);
  auto cluster = StartCluster(/*restart_stages=*/true);
  ASSERT_TRUE(cluster);
  const std::string id = testing::Submit(cluster->coordinator_address(), Job(120, 10));
  const std::string dir = cluster->run_dir() + "/stage-1/checkpoints/" + id + "/stage-1";
  int corrupted = 0;
  v1::JobStatus end = testing::Follow(cluster->coordinator_address(), id, [&](const v1::JobStatus& s) {
    if (corrupted || s.checkpoint_step() < 40) return;
    // Freeze the pipeline, damage stage 1's newest checkpoints (keeping the
    // oldest), then kill stage 2: the recovery must notice and go back further.
    for (int i = 0; i < 4; ++i) cluster->Signal(i, SIGSTOP);
    std::vector<std::filesystem::path> files;
    for (const std::string& name : ListDir(dir))
      if (std::filesystem::path(name).extension() == ".ckpt") files.push_back(std::filesystem::path(dir) / name);
    std::sort(files.begin(), files.end());
    for (std::size_t i = 1; i < files.size(); ++i) {
      auto bytes = ReadWholeFile(files[i].string());
      ASSERT_TRUE(bytes.ok());
      (*bytes)[bytes->size() / 2] ^= 0x5a;
      ASSERT_TRUE(WriteFileDurably(files[i].string(), *bytes).ok());
      ++corrupted;
    }
    cluster->Signal(2, SIGKILL);
    for (int i = 0; i < 4; ++i) cluster->Signal(i, SIGCONT);
  });
  ASSERT_GT(corrupted, 0);
  EXPECT_EQ(end.state(), v1::JOB_STATE_SUCCEEDED) << end.error() << "\n" << Events(end);
  EXPECT_EQ(end.param_digest(), clean.param_digest());
  EXPECT_THAT(Events(end), HasSubstr("checksum does not match"));
  EXPECT_THAT(Events(end), HasSubstr("using an older one"));
  EXPECT_GE(end.recoveries(), 1);
}

// The chaos test: stage processes die three times (twice by
// SIGKILL from outside at points drawn from the seed, once by their own hand
// halfway through writing a checkpoint) and the coordinator once; the job
// ends with the uninterrupted run's digest. CONVEYOR_CHAOS_SEED replays a run.
// `replicas` 2: the job is 2 replicas of 2 stages on the 4 servers; only
// replica 0's servers write checkpoints, so one of them kills itself in a
// write, and a restored replica 1 gets its state from replica 0.
// `zero` 1: the job shards its optimizer state (ZeRO-1) and must still end
// at the unsharded uninterrupted run's digest.
// Who dies when in a chaos run: two stage kills and the coordinator's at step
// thresholds, and one stage that kills itself in its n-th checkpoint write.
struct ChaosKill {
  int at_step;
  int victim;  // stage index, -1: the coordinator
};
struct ChaosPlan {
  int self_victim, self_write;
  std::vector<ChaosKill> kills;  // by step
};

ChaosPlan DrawChaos(uint64_t seed, int replicas, int every) {
  std::mt19937_64 rng(seed);
  auto draw = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  ChaosPlan plan;
  plan.self_victim = draw(0, replicas > 1 ? 1 : 3);
  plan.self_write = draw(3, 20);
  // The stages killed from outside are others: a restart would clear the hook.
  auto other = [&] { return (plan.self_victim + draw(1, 3)) % 4; };
  plan.kills = {{draw(15, 120), other()}, {draw(121, 200), other()}, {draw(50, 240), -1}};
  std::sort(plan.kills.begin(), plan.kills.end(),
            [](const ChaosKill& a, const ChaosKill& b) { return a.at_step < b.at_step; });
  for (const auto& k : plan.kills)
    std::printf("  kill %s at step %d\n", k.victim < 0 ? "the coordinator" : ("stage " + std::to_string(k.victim)).c_str(),
                k.at_step);
  std::printf("  stage %d kills itself in its checkpoint write #%d (step %d)\n", plan.self_victim, plan.self_write,
              plan.self_write * every);
  return plan;
}

// One failure as the watcher saw it: from the kill to RECOVERING, from there
// to RUNNING again, and the steps trained again.
struct ChaosRecovery {
  double detect_s = -1, recover_s = 0;
  int64_t steps_lost = 0;
};

// Times each recovery from the job's states as they stream by.
class RecoveryClock {
 public:
  void Killed() { killed_at_ = Clock::now(); }
  void Saw(const v1::JobStatus& s) {
    const bool recovering = s.state() == v1::JOB_STATE_RECOVERING;
    if (recovering && !was_recovering_) {
      recovering_at_ = Clock::now();
      failed_step_ = s.step();
      ChaosRecovery m;
      if (killed_at_ != Clock::time_point{})
        m.detect_s = std::chrono::duration<double>(recovering_at_ - killed_at_).count();
      killed_at_ = Clock::time_point{};
      recoveries_.push_back(m);
    }
    if (!recovering && was_recovering_ && s.state() == v1::JOB_STATE_RUNNING) {
      recoveries_.back().recover_s = std::chrono::duration<double>(Clock::now() - recovering_at_).count();
      recoveries_.back().steps_lost = failed_step_ - s.step();
    }
    was_recovering_ = recovering;
  }
  void Print() const {
    std::printf("%-10s %-14s %-14s %s\n", "failure", "detected (s)", "recovered (s)", "steps lost");
    for (std::size_t i = 0; i < recoveries_.size(); ++i) {
      const ChaosRecovery& m = recoveries_[i];
      std::printf("%-10zu %-14s %-14.2f %lld\n", i + 1,
                  m.detect_s < 0 ? "n/a" : std::to_string(m.detect_s).substr(0, 5).c_str(), m.recover_s,
                  static_cast<long long>(m.steps_lost));
    }
  }

 private:
  Clock::time_point killed_at_{}, recovering_at_{};
  int64_t failed_step_ = 0;
  bool was_recovering_ = false;
  std::vector<ChaosRecovery> recoveries_;
};

// Checkpoints: on every stage server without replicas; with them on replica
// 0's (servers 0 and 1) alone. (Any server may keep copies of another's, in
// copy-of-stage-<s>/: not counted.)
void ExpectCheckpointsWhereWritten(const std::string& run_dir, const std::string& id, int replicas) {
  for (int i = 0; i < 4; ++i) {
    int files = 0;
    const std::string dir = run_dir + "/stage-" + std::to_string(i) + "/checkpoints/" + id;
    for (const std::string& sub : ListDir(dir)) {
      if (sub.rfind("stage-", 0) != 0) continue;
      for (const std::string& name : ListDir(dir + "/" + sub)) files += std::filesystem::path(name).extension() == ".ckpt";
    }
    if (replicas > 1 && i >= 2) {
      EXPECT_EQ(files, 0) << "server " << i << " is in replica 1";
    } else {
      EXPECT_GT(files, 0) << "server " << i;
    }
  }
}

void Chaos(int replicas, int zero = 0) {
  const int steps = 300, every = 10;
  const v1::JobStatus& clean = Uninterrupted(steps, every, replicas, zero);
  uint64_t seed = std::random_device{}();
  if (const char* env = std::getenv("CONVEYOR_CHAOS_SEED")) seed = std::strtoull(env, nullptr, 10);
  std::printf("chaos seed %llu (CONVEYOR_CHAOS_SEED=%llu replays it)\n", static_cast<unsigned long long>(seed),
              static_cast<unsigned long long>(seed));
  const ChaosPlan plan = DrawChaos(seed, replicas, every);
  auto cluster =
      StartCluster(true, {{plan.self_victim, "CONVEYOR_CHAOS_KILL_IN_CHECKPOINT=" + std::to_string(plan.self_write)}});
  ASSERT_TRUE(cluster);
  const std::string id = testing::Submit(cluster->coordinator_address(), Job(steps, every, 60, replicas, zero));
  std::size_t next = 0;
  RecoveryClock clock;
  v1::JobStatus end = testing::Follow(cluster->coordinator_address(), id, [&](const v1::JobStatus& s) {
    clock.Saw(s);
    if (next >= plan.kills.size() || s.state() != v1::JOB_STATE_RUNNING || s.step() < plan.kills[next].at_step) return;
    const ChaosKill k = plan.kills[next++];
    std::printf("  step %lld: killing %s\n", static_cast<long long>(s.step()),
                k.victim < 0 ? "the coordinator" : ("stage " + std::to_string(k.victim)).c_str());
    cluster->Signal(k.victim, SIGKILL);
    if (k.victim < 0) {
      ASSERT_TRUE(cluster->RestartCoordinator().ok());
    } else {
      clock.Killed();
    }
  });
  EXPECT_EQ(next, plan.kills.size()) << "the job ended before every kill";
  EXPECT_EQ(end.state(), v1::JOB_STATE_SUCCEEDED) << end.error() << "\n" << Events(end);
  EXPECT_EQ(end.param_digest(), clean.param_digest()) << Events(end);
  EXPECT_EQ(cluster->stage_restarts(), 3);
  clock.Print();
  std::printf("events:\n%s", Events(end).c_str());
  ExpectCheckpointsWhereWritten(cluster->run_dir(), id, replicas);
}

TEST(Recovery, ChaosKillsThreeStagesAndTheCoordinator) { Chaos(1); }

TEST(Recovery, ChaosKillsStagesOfTwoReplicasOfTwoStagesAndTheCoordinator) {
  if (!ReplicaGroupsAvailable()) GTEST_SKIP() << "built without c10d's Gloo group";
  Chaos(2);
}

// The same with zero: 1: each replica updates half of each stage's parameters
// with half of the optimizer state (AdamW's moments, with clipping and loss
// scaling's skipped steps through ApplyStep); replica 0 gathers the shards
// into each checkpoint, and every restore hands each replica its own. The job
// ends at the digest of the uninterrupted run with sharding (which equals
// the unsharded one to float rounding only: with clipping, each copy's norm
// is summed from its slices, Zero.ClippingByTheGlobalNormUnderShardingTrainsAsWithout).
TEST(Recovery, ChaosWithTheOptimizerShardedOverTwoReplicasEndsAtTheUninterruptedDigest) {
  if (!ReplicaGroupsAvailable()) GTEST_SKIP() << "built without c10d's Gloo group";
  Chaos(2, /*zero=*/1);
}

// `conveyor submit --wait` follows its job across a coordinator restart: it
// exited 1 when the coordinator went away, while the job went on and succeeded.
// Two steps in flight (the default): without clipping over stages or loss
// scaling the coordinator sends each step before the last one's replies. A
// stage killed then, with the next step queued behind the one it dies in,
// recovers to the uninterrupted run's losses and digest.
TEST(Recovery, AStageKilledWithTwoStepsInFlightRecoversToTheUninterruptedDigest) {
  const std::string job =
      "name: in-flight\nmodel: {name: mlp, input_dim: 32, hidden: [64, 64, 32]}\npartition: {stages: 4}\n"
      "data: {name: synthetic, train_samples: 2048}\nbatch_size: 16\nmicro_batches: 4\nschedule: 1f1b\n"
      "optimizer: {name: adamw, lr: 0.001}\nseed: 6\nstage_timeout: 10\nsteps: 150\ncheckpoint_every: 10\n";
  v1::JobStatus clean;
  {
    auto cluster = StartCluster(/*restart_stages=*/false);
    ASSERT_TRUE(cluster);
    clean = testing::SubmitAndWait(cluster->coordinator_address(), job);
    ASSERT_EQ(clean.state(), v1::JOB_STATE_SUCCEEDED) << clean.error();
  }
  auto cluster = StartCluster(/*restart_stages=*/true);
  ASSERT_TRUE(cluster);
  bool killed = false, recovering = false;
  const v1::JobStatus end = testing::SubmitAndWait(cluster->coordinator_address(), job, [&](const v1::JobStatus& s) {
    if (!killed && s.step() >= 25) {
      killed = true;
      cluster->Signal(2, SIGKILL);
    }
    recovering |= s.state() == v1::JOB_STATE_RECOVERING;
  });
  ASSERT_TRUE(killed);
  EXPECT_TRUE(recovering) << "the job ended before the kill";
  EXPECT_EQ(end.state(), v1::JOB_STATE_SUCCEEDED) << end.error() << "\n" << Events(end);
  EXPECT_EQ(cluster->stage_restarts(), 1);
  EXPECT_EQ(end.param_digest(), clean.param_digest());
  ASSERT_EQ(end.losses_size(), clean.losses_size());
  for (int i = 0; i < end.losses_size(); ++i) EXPECT_EQ(end.losses(i), clean.losses(i)) << "step " << i;
}

// `conveyor resume`: a job cancelled, and one failed because a stage stopped
// answering past recovery_timeout, go on from their last complete checkpoint
// (optimizer state, schedule, loss scale, data order) and end at the
// uninterrupted run's losses and digest. Only a failed or cancelled job resumes.
TEST(Recovery, FailedAndCancelledJobsResumeToTheUninterruptedDigest) {
  // 200 steps: the cancel, a process of its own, is asked for at the
  // checkpoint of step 20 and must land before the last step (about 9 s
  // later on the 2-core machine, 50 ms a step).
  constexpr int kSteps = 200;
  const v1::JobStatus& clean = Uninterrupted(kSteps, 10);
  auto cluster = StartCluster(/*restart_stages=*/false);
  ASSERT_TRUE(cluster);
  const std::string addr = cluster->coordinator_address();
  auto cli = [&](const std::string& verb, const std::string& id) {
    return testing::RunCommand({testing::Binary("conveyor"), "--coordinator", addr, verb, id, "--wait"});
  };
  auto expect_clean = [&](const v1::JobStatus& end) {
    EXPECT_EQ(end.state(), v1::JOB_STATE_SUCCEEDED) << end.error() << "\n" << Events(end);
    EXPECT_EQ(end.param_digest(), clean.param_digest());
    ASSERT_EQ(end.losses_size(), clean.losses_size());
    for (int i = 0; i < end.losses_size(); ++i) EXPECT_EQ(end.losses(i), clean.losses(i)) << "step " << i;
  };

  // Cancelled once the checkpoint of step 20 is complete.
  const std::string cancelled = testing::Submit(addr, Job(kSteps, 10, /*recovery_timeout=*/2));
  bool asked = false;
  v1::JobStatus end = testing::Follow(addr, cancelled, [&](const v1::JobStatus& s) {
    if (!asked && s.checkpoint_step() >= 20) {
      asked = true;
      testing::RunCommand({testing::Binary("conveyor"), "--coordinator", addr, "cancel", s.job_id()});
    }
  });
  ASSERT_EQ(end.state(), v1::JOB_STATE_CANCELLED) << end.error();
  const int64_t from = end.checkpoint_step();
  testing::CommandResult r = cli("resume", cancelled);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("resumed after it was cancelled (cancelled by the user): it goes on from the "
                               "checkpoint of step " + std::to_string(from)));
  end = testing::Follow(addr, cancelled);
  expect_clean(end);
  EXPECT_THAT(Events(end), HasSubstr("restored every stage from the checkpoint of step " + std::to_string(from)));

  // Refused: a job that succeeded, and one that does not exist.
  r = cli("resume", cancelled);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("only a failed or cancelled job resumes"));
  EXPECT_THAT(r.err, HasSubstr("FAILED_PRECONDITION"));
  r = cli("resume", "job-404");
  EXPECT_THAT(r.err, HasSubstr("NOT_FOUND"));

  // Failed: stage 1 stops (SIGSTOP) past recovery_timeout, then goes on (SIGCONT).
  const std::string failed =
      testing::Submit(addr, Job(kSteps, 10, /*recovery_timeout=*/2, 1, 0, "on_lost_server: fail\n"));
  bool stopped = false;
  end = testing::Follow(addr, failed, [&](const v1::JobStatus& s) {
    if (!stopped && s.checkpoint_step() >= 20) {
      stopped = true;
      cluster->Signal(1, SIGSTOP);
    }
  });
  cluster->Signal(1, SIGCONT);
  ASSERT_EQ(end.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(end.error(), HasSubstr("did not come back within recovery_timeout"));
  r = cli("resume", failed);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("resumed after it failed"));
  expect_clean(testing::Follow(addr, failed));
}

TEST(Recovery, SubmitWaitFollowsItsJobAcrossACoordinatorRestart) {
  auto cluster = StartCluster(false);
  ASSERT_TRUE(cluster);
  const std::string dir = testing::MakeTempDir("submit-wait");
  const std::string job = dir + "/job.yaml";
  {
    std::ofstream f(job);
    f << Job(60, 10);
  }
  auto cli = std::async(std::launch::async, [&] {
    return testing::RunCommand(
        {testing::Binary("conveyor"), "--coordinator", cluster->coordinator_address(), "submit", job, "--wait"});
  });
  bool killed = false;
  const v1::JobStatus end = FollowKillingTheCoordinator(
      *cluster, "job-1", [](const v1::JobStatus& s) { return s.checkpoint_step() > 0; }, &killed);
  const testing::CommandResult r = cli.get();
  RemoveTree(dir);
  EXPECT_TRUE(killed);
  ASSERT_EQ(end.state(), v1::JOB_STATE_SUCCEEDED) << end.error();
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("lost the coordinator"));
  EXPECT_THAT(r.out, HasSubstr(end.param_digest()));
}

}  // namespace
}  // namespace conveyor
