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
#include <string>
#include <vector>

#include "conveyor.pb.h"
#include "coordinator/job_store.h"

namespace conveyor {

// The learning rate of training step `step` (0-based). Until the job file
// has schedules this is optimizer.lr; a schedule replaces this function.
double LearningRateAt(const v1::JobSpec& spec, int64_t step);
// Tokens in one sample (gpt models and token data), 0 otherwise.
int64_t TokensPerSample(const v1::JobSpec& spec);

// Sets conveyor_jobs{state} from every job in the database.
void PublishJobCounts(const std::vector<v1::JobStatus>& jobs);

class JobMetrics {
 public:
  // `store` (not owned, may be null: no curves kept) outlives this.
  JobMetrics(const v1::JobSpec& spec, std::string job_id, JobStore* store);
  JobMetrics(const JobMetrics&) = delete;
  JobMetrics& operator=(const JobMetrics&) = delete;

  // Training step `step` (0-based) took `seconds` and ended with `loss`.
  void Step(int64_t step, double seconds, double loss, double samples_per_second);
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
