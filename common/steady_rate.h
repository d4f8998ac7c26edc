// A run's steady throughput, taken between two points at which the device
// had finished every step counted.
//
// A trainer that reads a step's figures after it has launched the next one
// (the reference on CUDA) waits, at that read, for both steps: the device has
// then finished one step more than the one read. Counting steps by the one
// read, as the clock once did, put one step more into the window than its
// time covered (a 6-step run counted 4 steps over 3 steps of time: 1.33x).
// Here each mark says how many steps the device had finished when the time
// was taken; the window starts at the first mark past the warm-up and counts
// only the steps finished between its two ends.
//
// Measurements, not decisions: callers pass steady_clock time points.
#pragma once

#include <chrono>
#include <cstdint>

namespace conveyor {

class SteadyRate {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;

  // `warmup`: steps the window leaves out (start-up: CUDA, the allocator,
  // cuDNN's choices); `samples_per_step`: samples one step trains on.
  SteadyRate(int64_t warmup, int64_t samples_per_step) : warmup_(warmup), samples_per_step_(samples_per_step) {}

  // At `now` the device had finished `done` steps of this run (every step
  // up to and including the `done`-th; a mark is taken after a wait for the
  // device, a loss read or a synchronize). Marks come in order of time; a
  // smaller `done` than an earlier mark's is ignored.
  void Mark(int64_t done, TimePoint now);

  // Steps finished inside the window, and its length: 0 until two marks
  // past the warm-up are apart by a step.
  int64_t steps() const { return started_ ? end_done_ - start_done_ : 0; }
  double seconds() const;
  // steps() x samples_per_step / seconds(); 0 while steps() is 0.
  double samples_per_second() const;

 private:
  int64_t warmup_, samples_per_step_;
  bool started_ = false;
  int64_t start_done_ = 0, end_done_ = 0;
  TimePoint start_, end_;
};

}  // namespace conveyor
