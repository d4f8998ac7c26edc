// The steady clock's window (common/steady_rate.h): steps counted are steps
// the device finished between the window's two ends, whichever step's
// figures were being read at each end.
#include "common/steady_rate.h"

#include <gtest/gtest.h>

#include <vector>

namespace conveyor {
namespace {

using TimePoint = SteadyRate::TimePoint;

TimePoint At(double seconds) {
  return TimePoint(std::chrono::duration_cast<TimePoint::duration>(std::chrono::duration<double>(seconds)));
}

// A trainer whose device takes exactly one second a step and whose host
// launches step n+1 before it reads step n's loss (the reference on CUDA): the
// read of step n returns when steps n and n+1 are done. The last step is read
// at once. Returns the marks the trainer gives, in order.
struct Mark {
  int64_t read_step;  // the 1-based step whose figures were read
  int64_t done;       // steps the device had finished then
  double time;
};
std::vector<Mark> DeferredReads(int64_t steps) {
  std::vector<Mark> marks;
  for (int64_t launched = 2; launched <= steps; ++launched)
    marks.push_back({launched - 1, launched, static_cast<double>(launched)});  // read n-1 after launching n
  marks.push_back({steps, steps, static_cast<double>(steps)});                 // the last, read at once
  return marks;
}

TEST(SteadyRate, OneStepReadLateIsNotCountedBeforeTheDeviceFinishedIt) {
  // 6 steps, 2 of warm-up, 32 samples a step, one second a step: 32 samples/s.
  SteadyRate rate(2, 32);
  for (const Mark& m : DeferredReads(6)) rate.Mark(m.done, At(m.time));
  EXPECT_EQ(rate.steps(), 4);
  EXPECT_DOUBLE_EQ(rate.seconds(), 4.0);
  EXPECT_DOUBLE_EQ(rate.samples_per_second(), 32.0);

  // The old clock counted by the step read: its window started when step 2
  // was read (step 3 done, 3 s) and counted steps 3..6 over the 3 s left,
  // 1.33x the device's rate. Kept here as the figure this test guards against.
  const double old_clock = 4 * 32 / (6.0 - 3.0);
  EXPECT_GT(old_clock / rate.samples_per_second(), 1.3);
}

TEST(SteadyRate, EveryStepReadAtOnceGivesTheSameWindow) {
  SteadyRate rate(2, 10);
  for (int64_t done = 1; done <= 6; ++done) rate.Mark(done, At(static_cast<double>(done) * 0.5));
  EXPECT_EQ(rate.steps(), 4);
  EXPECT_DOUBLE_EQ(rate.seconds(), 2.0);
  EXPECT_DOUBLE_EQ(rate.samples_per_second(), 20.0);
}

TEST(SteadyRate, NothingUntilTheWindowHoldsAStep) {
  SteadyRate rate(2, 8);
  rate.Mark(1, At(1));
  EXPECT_EQ(rate.steps(), 0);
  EXPECT_EQ(rate.samples_per_second(), 0);
  rate.Mark(2, At(2));  // the window opens
  EXPECT_EQ(rate.steps(), 0);
  EXPECT_EQ(rate.samples_per_second(), 0);
  rate.Mark(2, At(3));  // the same step read again (an epoch's end): the end does not move
  EXPECT_EQ(rate.steps(), 0);
  rate.Mark(3, At(4));
  EXPECT_EQ(rate.steps(), 1);
  EXPECT_DOUBLE_EQ(rate.seconds(), 2.0);
  EXPECT_DOUBLE_EQ(rate.samples_per_second(), 4.0);
}

TEST(SteadyRate, ARunShorterThanItsWarmUpStartsAtItsFirstMarkPastIt) {
  SteadyRate rate(0, 1);  // a 1-step run keeps no step out
  rate.Mark(0, At(0));
  rate.Mark(1, At(0.25));
  EXPECT_EQ(rate.steps(), 1);
  EXPECT_DOUBLE_EQ(rate.samples_per_second(), 4.0);
}

}  // namespace
}  // namespace conveyor
