#include "coordinator/job_metrics.h"

#include <map>

#include "common/logging.h"
#include "common/metrics.h"
#include "plan/job_spec.h"

namespace conveyor {

void PublishJobCounts(const std::map<v1::JobState, int>& counts) {
  for (int s = v1::JobState_MIN; s <= v1::JobState_MAX; ++s) {
    if (!v1::JobState_IsValid(s) || s == v1::JOB_STATE_UNSPECIFIED) continue;
    auto it = counts.find(static_cast<v1::JobState>(s));
    metrics::Set(metrics::Id::kJobs, {{"state", JobStateName(static_cast<v1::JobState>(s))}},
                 it == counts.end() ? 0 : it->second);
  }
}

JobMetrics::JobMetrics(const v1::JobSpec& spec, std::string job_id, JobStore* store)
    : spec_(spec), job_id_(std::move(job_id)), store_(store), tokens_per_sample_(TokensPerSample(spec)) {}

void JobMetrics::Step(int64_t step, const StepFigures& f) {
  const metrics::Labels job = {{"job_id", job_id_}};
  metrics::Add(metrics::Id::kSteps, job);
  metrics::Observe(metrics::Id::kStepSeconds, job, f.seconds);
  metrics::Set(metrics::Id::kLoss, job, f.loss);
  metrics::Set(metrics::Id::kLearningRate, job, f.lr);
  metrics::Set(metrics::Id::kSamplesPerSecond, job, f.samples_per_second);
  if (tokens_per_sample_ > 0)
    metrics::Set(metrics::Id::kTokensPerSecond, job, f.samples_per_second * static_cast<double>(tokens_per_sample_));

  v1::CurvePoint p;
  p.set_step(step + 1);
  p.set_loss(f.loss);
  p.set_lr(f.lr);
  p.set_has_grad_norm(true);
  p.set_grad_norm(f.grad_norm);
  p.set_step_seconds(f.seconds);
  const double step_rate = f.seconds > 0 ? static_cast<double>(spec_.batch_size()) / f.seconds : 0;
  p.set_samples_per_second(step_rate);
  p.set_tokens_per_second(step_rate * static_cast<double>(tokens_per_sample_));
  p.set_unix_ms(NowUnixMs());
  steps_.push_back(std::move(p));
  Flush(false);
}

void JobMetrics::Eval(int64_t steps_done, double loss, double accuracy) {
  const metrics::Labels job = {{"job_id", job_id_}};
  metrics::Set(metrics::Id::kEvalLoss, job, loss);
  metrics::Set(metrics::Id::kEvalAccuracy, job, accuracy);
  v1::EvalPoint e;
  e.set_step(steps_done);
  e.set_loss(loss);
  e.set_accuracy(accuracy);
  e.set_unix_ms(NowUnixMs());
  evals_.push_back(std::move(e));
  Flush(true);
}

void JobMetrics::Checkpoint() {
  metrics::Add(metrics::Id::kCheckpoints, {{"job_id", job_id_}});
  Flush(true);
}

void JobMetrics::Recovery() {
  metrics::Add(metrics::Id::kRecoveries, {{"job_id", job_id_}});
  Flush(true);
}

void JobMetrics::Rewind(int64_t step) {
  Flush(/*now=*/true);
  if (!store_) return;
  Status st = store_->DropCurves(job_id_, step);
  if (!st.ok()) LOG_ERROR("job ", job_id_, ": dropping its curves after step ", step, ": ", st.message());
}

void JobMetrics::Flush(bool now) {
  constexpr auto kEvery = std::chrono::seconds(1);
  if (steps_.empty() && evals_.empty()) return;
  if (!now && std::chrono::steady_clock::now() - last_flush_ < kEvery) return;
  last_flush_ = std::chrono::steady_clock::now();
  if (store_) {
    Status st = store_->AddCurves(job_id_, steps_, evals_);
    if (!st.ok()) LOG_ERROR("job ", job_id_, ": saving its curves: ", st.message());
  }
  steps_.clear();
  evals_.clear();
}

}  // namespace conveyor
