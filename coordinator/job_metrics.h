// What a running job reports besides its status: the coordinator's
// Prometheus series of the job (common/metrics.h) and its training curves
// (per-step rows and evaluations) in the job database.
//
// Curve rows are kept in memory and written in one transaction at most once
// a second (a step of a small model takes a millisecond), and at once at a
// checkpoint, an evaluation and the job's end.
//
// Used by the job runner's thread alone.
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "conveyor.pb.h"
#include "coordinator/job_store.h"

namespace conveyor {

// Sets conveyor_jobs{state} from the jobs in the database in each state (a
// state missing from `counts` has none).
void PublishJobCounts(const std::map<v1::JobState, int>& counts);

class JobMetrics {
 public:
  // `store` (not owned, may be null: no curves kept) outlives this.
  JobMetrics(const v1::JobSpec& spec, std::string job_id, JobStore* store);
  JobMetrics(const JobMetrics&) = delete;
  JobMetrics& operator=(const JobMetrics&) = delete;

  // What one training step gives the metrics and the curves.
  struct StepFigures {
    double seconds = 0;             // the step's wall time
    double loss = 0;
    double lr = 0;                  // its learning rate, as lr_schedule gives it
    double grad_norm = 0;           // the global gradient norm, before clipping
    double samples_per_second = 0;  // the job's, so far
  };
  // Training step `step` (0-based).
  void Step(int64_t step, const StepFigures& f);
  // An evaluation after `steps_done` steps.
  void Eval(int64_t steps_done, double loss, double accuracy);
  void Checkpoint();
  void Recovery();
  // The job goes on from step `step` (a checkpoint, or 0): the curve rows of
  // later steps are dropped from the store, as they run again.
  void Rewind(int64_t step);
  // Writes the curve rows kept: at once with `now`, else once a second passed
  // since the last write.
  void Flush(bool now);

 private:
  v1::JobSpec spec_;
  std::string job_id_;
  JobStore* store_;
  int64_t tokens_per_sample_;
  std::vector<v1::CurvePoint> steps_;
  std::vector<v1::EvalPoint> evals_;
  std::chrono::steady_clock::time_point last_flush_ = std::chrono::steady_clock::now();  // a rate: real time
};

}  // namespace conveyor
