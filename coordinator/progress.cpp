#include "coordinator/progress.h"

#include <algorithm>
#include <cmath>
#include <iterator>

#include "coordinator/job_store.h"
#include "plan/job_spec.h"

namespace conveyor {

void Progress::InitStages(std::size_t stages) {
  if (!busy_.empty()) return;
  busy_.assign(stages, 0);
  wall_.assign(stages, 0);
}

bool Progress::StartRun(int64_t first, int64_t total, int64_t batch, int64_t steps_per_epoch, bool by_epochs) {
  first_ = first;
  total_ = total;
  batch_ = batch;
  steps_per_epoch_ = steps_per_epoch;
  start_ = SteadyClock::now();
  // A stage replies once its device finished the step (FinishOnDevice): a
  // step's reply is a point at which every step up to it is done.
  steady_.emplace(first + std::min<int64_t>(kWarmupSteps, total - first - 1), batch);
  // Epochs that a resumed run trains again are reported again; one that
  // ended where it resumes (a checkpoint at its end, a failure while it was
  // evaluated) is reported now.
  auto* epochs = status_->mutable_epochs();
  while (!epochs->empty() && epochs->rbegin()->epoch() * steps_per_epoch > first) epochs->RemoveLast();
  return by_epochs && first > 0 && first % steps_per_epoch == 0 &&
         (epochs->empty() || epochs->rbegin()->epoch() * steps_per_epoch < first);
}

void Progress::StartEpoch(int64_t first_step) {
  epoch_start_ = SteadyClock::now();
  epoch_first_step_ = first_step;
}

double Progress::EpochSeconds() const {
  return std::chrono::duration<double>(SteadyClock::now() - epoch_start_).count();
}

void Progress::AddStep(int64_t step, const std::vector<v1::RunStepReply>& replies, SteadyClock::time_point start,
                       SteadyClock::time_point end) {
  // Last stages report their share of the loss, the others 0: with replicas
  // the sum is the whole batch's.
  double loss = 0;
  for (const v1::RunStepReply& r : replies) loss += r.loss_sum();
  status_->add_losses(static_cast<float>(loss));
  status_->set_loss(static_cast<float>(loss));
  for (std::size_t s = 0; s < replies.size(); ++s) {
    busy_[s] += replies[s].busy_seconds();
    wall_[s] += replies[s].step_seconds();
    v1::StageReport* r = status_->mutable_stages(static_cast<int>(s));
    r->set_peak_activations(std::max(r->peak_activations(), replies[s].peak_activations()));
    if (replies[s].graphed()) r->set_graphed_steps(r->graphed_steps() + 1);
    r->set_peak_activation_bytes(std::max(r->peak_activation_bytes(), replies[s].peak_activation_bytes()));
    r->set_parameter_bytes(std::max(r->parameter_bytes(), replies[s].parameter_bytes()));
    r->set_gradient_bytes(std::max(r->gradient_bytes(), replies[s].gradient_bytes()));
    r->set_optimizer_state_bytes(std::max(r->optimizer_state_bytes(), replies[s].optimizer_state_bytes()));
    r->set_device_peak_bytes(std::max(r->device_peak_bytes(), replies[s].device_peak_bytes()));
    r->set_busy_fraction(wall_[s] > 0 ? busy_[s] / wall_[s] : 0);
    r->set_idle_fraction(wall_[s] > 0 ? std::max(0.0, 1 - busy_[s] / wall_[s]) : 0);
  }
  auto us = [](SteadyClock::duration d) { return std::chrono::duration_cast<std::chrono::microseconds>(d).count(); };
  KeepTrace(step + 1, replies, us(end - start), step > first_ ? us(start - previous_step_end_) : 0);
  status_->add_step_seconds(std::chrono::duration<double>(end - (step > first_ ? previous_step_end_ : start_)).count());
  previous_step_end_ = end;
  const double elapsed = std::chrono::duration<double>(SteadyClock::now() - start_).count();
  const int64_t done = step + 1;
  status_->set_step(done);
  status_->set_epoch(static_cast<int>(step / steps_per_epoch_) + 1);
  status_->set_elapsed_seconds(elapsed);
  status_->set_samples_per_second(elapsed > 0 ? static_cast<double>((done - first_) * batch_) / elapsed : 0);
  status_->set_eta_seconds(elapsed / static_cast<double>(done - first_) * static_cast<double>(total_ - done));
  steady_->Mark(done, end);
  if (steady_->steps() > 0) {
    status_->set_steady_samples_per_second(steady_->samples_per_second());
    status_->set_steady_steps(steady_->steps());
    status_->set_steady_seconds(steady_->seconds());
  }
  // The last steps, and at least an epoch's (its mean loss is taken from them).
  BoundSeries(status_, static_cast<int>(std::min<int64_t>(std::max<int64_t>(kSeriesSteps, steps_per_epoch_), 1 << 30)));
}

void Progress::KeepTrace(int64_t step, const std::vector<v1::RunStepReply>& replies, int64_t wall_us,
                         int64_t since_previous_us) {
  v1::StepTrace trace;
  trace.set_wall_us(wall_us);
  trace.set_since_previous_us(since_previous_us);
  trace.set_job_id(status_->job_id());
  trace.set_step(step);
  trace.set_schedule(status_->schedule());
  trace.set_micro_batches(status_->micro_batches());
  trace.set_virtual_stages(status_->virtual_stages());
  for (std::size_t s = 0; s < replies.size(); ++s) {
    v1::StageTrace* st = trace.add_stages();
    st->set_stage(static_cast<int>(s));
    st->set_step_us(static_cast<int64_t>(replies[s].step_seconds() * 1e6));
    *st->mutable_events() = replies[s].events();
  }
  std::lock_guard<std::mutex> lock(trace_mu_);
  traces_[step] = std::move(trace);
  // Keep the first steps (start-up) and the last ones (steady state).
  while (static_cast<int>(traces_.size()) > kFirstTraces + kLastTraces) {
    auto it = traces_.begin();
    std::advance(it, kFirstTraces);
    traces_.erase(it);
  }
  status_->clear_traced_steps();
  for (const auto& [k, v] : traces_) status_->add_traced_steps(k);
}

StatusOr<v1::StepTrace> Progress::Trace(int64_t step) const { return FindTrace(Traces(), step); }

std::vector<v1::StepTrace> Progress::Traces() const {
  std::lock_guard<std::mutex> lock(trace_mu_);
  std::vector<v1::StepTrace> out;
  for (const auto& [k, v] : traces_) out.push_back(v);
  return out;
}

LossScaleState ReplaySeriesLossScale(const v1::JobSpec& spec, const v1::JobStatus& status) {
  const auto& norms = status.grad_norms();
  const auto& scales = status.loss_scales();
  const int64_t first = status.step() - norms.size() + 1;  // the step of norms(0)
  if (first <= 1 || !LossScaling(spec) || scales.size() != norms.size() || scales.empty())
    return ReplayLossScale(spec, norms.data(), std::min<int64_t>(status.step(), norms.size()));
  int from = scales.size() - 1;
  while (from > 0 && scales.Get(from) == scales.Get(from - 1)) --from;
  LossScaleState state{scales.Get(from), 0};
  for (int i = from; i < norms.size(); ++i) UpdateLossScale(spec, !std::isfinite(norms.Get(i)), &state);
  return state;
}

v1::EpochReport EpochOfSeries(const v1::JobStatus& status, int64_t steps_per_epoch, int64_t timed_steps,
                              int64_t batch_size, double seconds) {
  const int n = static_cast<int>(std::min<int64_t>(status.losses_size(), steps_per_epoch));
  google::protobuf::RepeatedField<float> losses(status.losses().end() - n, status.losses().end());
  v1::EpochReport e = EpochSummary(losses, n, std::max(n, 1), timed_steps, batch_size, seconds);
  e.set_epoch(static_cast<int>(status.step() / steps_per_epoch));
  return e;
}

StatusOr<v1::StepTrace> FindTrace(const std::vector<v1::StepTrace>& traces, int64_t step) {
  if (traces.empty()) return absl::NotFoundError("no step of this job has a timeline yet");
  if (step < 0) return traces.back();
  std::string kept;
  for (const auto& t : traces) {
    if (t.step() == step) return t;
    kept += (kept.empty() ? "" : ", ") + std::to_string(t.step());
  }
  return absl::NotFoundError("step " + std::to_string(step) + " has no timeline; kept: " + kept);
}

}  // namespace conveyor
