// A running job's bookkeeping: takes each training step's replies and keeps
// the status fields that describe progress (losses, the stages' peaks and busy
// fractions, step, epoch, elapsed time, throughput, ETA), the epochs reported,
// and the timelines of some steps.
//
// Times here are measurements, not decisions: they use the steady clock.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

#include "common/status.h"
#include "common/steady_rate.h"
#include "plan/lr_schedule.h"
#include "conveyor.pb.h"

namespace conveyor {

class Progress {
 public:
  using SteadyClock = std::chrono::steady_clock;

  // `status` (not owned) is the job's, and outlives this; its schedule,
  // micro_batches and virtual_stages are set before the first step.
  explicit Progress(v1::JobStatus* status) : status_(status) {}
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // The per-stage sums of busy and wall time start at zero, the first time
  // only (a recovery keeps them).
  void InitStages(std::size_t stages);

  // A training run starts (or resumes) at the status's step, `first`, of
  // `total`, `batch` samples a step, `steps_per_epoch` steps an epoch.
  // Epochs that the run trains again are dropped from the status. Returns
  // whether an epoch ended exactly where the run resumes and was not
  // reported yet (the caller reports it now, its time unknown).
  bool StartRun(int64_t first, int64_t total, int64_t batch, int64_t steps_per_epoch, bool by_epochs);
  // An epoch starts at step `first_step` (now).
  void StartEpoch(int64_t first_step);
  int64_t epoch_first_step() const { return epoch_first_step_; }
  // Seconds since StartEpoch.
  double EpochSeconds() const;

  // Training step `step` (0-based) ran from `start` to `end`; `replies` in
  // stage order. Updates the status and keeps the step's timeline.
  void AddStep(int64_t step, const std::vector<v1::RunStepReply>& replies, SteadyClock::time_point start,
               SteadyClock::time_point end);

  // Timelines kept so far: the first kFirstTraces steps and the last
  // kLastTraces. Thread-safe. step -1: the last one kept.
  static constexpr int kFirstTraces = 3;
  static constexpr int kLastTraces = 10;
  StatusOr<v1::StepTrace> Trace(int64_t step) const;
  std::vector<v1::StepTrace> Traces() const;

 private:
  void KeepTrace(int64_t step, const std::vector<v1::RunStepReply>& replies, int64_t wall_us,
                 int64_t since_previous_us);

  v1::JobStatus* status_;
  std::vector<double> busy_, wall_;  // per stage, summed over steps
  int64_t first_ = 0, total_ = 0, batch_ = 0, steps_per_epoch_ = 0;
  std::optional<SteadyRate> steady_;  // this run's (StartRun)
  SteadyClock::time_point start_, epoch_start_, previous_step_end_;
  int64_t epoch_first_step_ = 0;

  mutable std::mutex trace_mu_;  // guards traces_ (status_ is the runner's alone)
  std::map<int64_t, v1::StepTrace> traces_;
};

// The loss scale for the step after `status`'s last, replayed from its
// series (each step's gradient norm and the scale it ran with). Series that
// hold every step from the first replay from loss_scale.init; series that
// hold the last steps only (BoundSeries) replay from their last change of
// scale, where the count of finite steps in a row was 0: exact whenever one
// falls in them (always, where they hold more than growth_interval steps).
LossScaleState ReplaySeriesLossScale(const v1::JobSpec& spec, const v1::JobStatus& status);

// The summary of the epoch that ends at `status`'s step (of `steps_per_epoch`
// steps, `timed_steps` of them timed over `seconds`), its mean loss over the
// epoch's steps the series hold.
v1::EpochReport EpochOfSeries(const v1::JobStatus& status, int64_t steps_per_epoch, int64_t timed_steps,
                              int64_t batch_size, double seconds);

// Finds a step's trace among `traces`; NOT_FOUND names the steps kept.
StatusOr<v1::StepTrace> FindTrace(const std::vector<v1::StepTrace>& traces, int64_t step);

}  // namespace conveyor
