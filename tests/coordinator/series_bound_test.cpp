// A running job's per-step series stay bounded however long it runs
// (BoundSeries), and stay aligned with its steps where the coordinator
// truncates them (a recovery), stores and reads them back (a restart), sums
// an epoch's losses and replays the loss scale from them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "coordinator/job_store.h"
#include "coordinator/progress.h"
#include "plan/lr_schedule.h"

namespace conveyor {
namespace {

// What the runner and Progress do for step `step` (0-based): the norm and
// learning rate first (JobRunner::Update), then the step's loss (AddStep).
// Each step's figures are its 0-based index, so that any element names its step.
void RunStep(Progress* progress, v1::JobStatus* status, int64_t step) {
  status->add_grad_norms(static_cast<double>(step));
  status->add_lrs(static_cast<double>(step));
  std::vector<v1::RunStepReply> replies(1);
  replies[0].set_loss_sum(static_cast<float>(step));
  const auto now = Progress::SteadyClock::now();
  progress->AddStep(step, replies, now, now);
}

v1::JobStatus RunSteps(int64_t steps, int* largest = nullptr) {
  v1::JobStatus status;
  status.set_job_id("job-1");
  status.add_stages();
  Progress progress(&status);
  progress.InitStages(1);
  progress.StartRun(0, steps, 8, 100, /*by_epochs=*/false);
  for (int64_t s = 0; s < steps; ++s) {
    RunStep(&progress, &status, s);
    if (largest) *largest = std::max(*largest, status.losses_size());
  }
  return status;
}

// Every series ends at the status's step: its element i is step first + i's.
void ExpectAligned(const v1::JobStatus& status) {
  const int64_t first = SeriesFirstStep(status);
  ASSERT_GE(first, 1);
  ASSERT_EQ(status.lrs_size(), status.losses_size());
  ASSERT_EQ(status.grad_norms_size(), status.losses_size());
  ASSERT_EQ(status.step_seconds_size(), status.losses_size());
  for (int i = 0; i < status.losses_size(); i += 997) {
    EXPECT_EQ(status.losses(i), static_cast<float>(first - 1 + i)) << "element " << i;
    EXPECT_EQ(status.lrs(i), static_cast<double>(first - 1 + i)) << "element " << i;
  }
  EXPECT_EQ(status.losses(status.losses_size() - 1), static_cast<float>(status.step() - 1));
}

TEST(SeriesBound, AJobOfManyStepsKeepsItsLastStepsOnly) {
  int largest = 0;
  const v1::JobStatus status = RunSteps(60000, &largest);
  EXPECT_EQ(status.step(), 60000);
  EXPECT_LE(largest, kSeriesSteps + kSeriesSteps / 4);  // never more, at any step
  EXPECT_GE(status.losses_size(), kSeriesSteps);
  ExpectAligned(status);
}

TEST(SeriesBound, AShortJobKeepsEveryStep) {
  const v1::JobStatus status = RunSteps(kSeriesSteps);
  EXPECT_EQ(status.losses_size(), kSeriesSteps);
  EXPECT_EQ(SeriesFirstStep(status), 1);
  ExpectAligned(status);
}

TEST(SeriesBound, TruncatingGoesBackToAStep) {
  v1::JobStatus status = RunSteps(23000);
  TruncateSeries(&status, 22000);
  status.set_step(22000);
  ExpectAligned(status);
  TruncateSeries(&status, 1000);  // older than the series: nothing is left of them
  status.set_step(1000);
  EXPECT_EQ(status.losses_size(), 0);
  EXPECT_EQ(status.step_seconds_size(), 0);
}

// A step whose update failed (ApplyStep to a stage that died) added its norm
// and learning rate but no loss: going back to a checkpoint drops them too.
TEST(SeriesBound, TruncatingDropsAStepThatFailedHalfway) {
  v1::JobStatus status = RunSteps(20000);
  status.add_grad_norms(20000);
  status.add_lrs(20000);
  TruncateSeries(&status, 19000);
  status.set_step(19000);
  ExpectAligned(status);
}

TEST(SeriesBound, TheStoreGivesTheSeriesWithTheStepTheyEndAt) {
  auto store = JobStore::Open(":memory:");
  ASSERT_TRUE(store.ok()) << store.status();
  v1::JobSpec spec;
  spec.set_name("long");
  auto id = (*store)->Insert(spec, "name: long", v1::JobStatus());
  ASSERT_TRUE(id.ok()) << id.status();
  v1::JobStatus status = RunSteps(25000);
  status.set_job_id(*id);
  status.set_state(v1::JOB_STATE_RUNNING);
  ASSERT_TRUE((*store)->RecordCheckpoints(status, {}).ok());  // the series, with a checkpoint
  const int kept = status.losses_size();
  status.set_step(25400);  // saved a second later, without its series: then the coordinator dies
  ASSERT_TRUE((*store)->Update(status, /*with_series=*/false).ok());
  auto got = (*store)->Get(*id);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->status.step(), 25000);
  EXPECT_EQ(got->status.losses_size(), kept);
  ExpectAligned(got->status);
}

TEST(SeriesBound, AnEpochsMeanLossIsItsOwnStepsOnes) {
  v1::JobStatus status = RunSteps(30000);
  const v1::EpochReport e = EpochOfSeries(status, 5000, 5000, 8, 2.0);
  EXPECT_EQ(e.epoch(), 6);
  EXPECT_FLOAT_EQ(e.mean_loss(), (25000 + 29999) / 2.0f);  // steps 25001..30000 had losses 25000..29999
  EXPECT_DOUBLE_EQ(e.samples_per_second(), 5000 * 8 / 2.0);
}

TEST(SeriesBound, TheLossScaleReplaysFromTheLastSteps) {
  v1::JobSpec spec;
  spec.mutable_loss_scale()->set_dynamic(true);
  spec.mutable_loss_scale()->set_init(65536);
  spec.mutable_loss_scale()->set_growth_factor(2);
  spec.mutable_loss_scale()->set_backoff_factor(0.5);
  spec.mutable_loss_scale()->set_growth_interval(700);
  std::mt19937 rng(3);
  v1::JobStatus full;
  LossScaleState state = InitialLossScale(spec);
  for (int64_t s = 0; s < 40000; ++s) {
    const bool inf = rng() % 1500 == 0;
    full.add_loss_scales(state.scale);
    full.add_grad_norms(inf ? INFINITY : 1.0);
    full.add_losses(0);
    UpdateLossScale(spec, inf, &state);
  }
  full.set_step(40000);
  v1::JobStatus windowed = full;
  BoundSeries(&windowed);
  ASSERT_LT(windowed.grad_norms_size(), full.grad_norms_size());
  const LossScaleState got = ReplaySeriesLossScale(spec, windowed);
  EXPECT_EQ(got.scale, state.scale);
  EXPECT_EQ(got.growth_tracker, state.growth_tracker);
  const LossScaleState all = ReplaySeriesLossScale(spec, full);
  EXPECT_EQ(all.scale, state.scale);
}

}  // namespace
}  // namespace conveyor
