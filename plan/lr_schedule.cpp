#include "plan/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace conveyor {

double LearningRate(const v1::JobSpec& spec, int64_t t, int64_t total_steps) {
  const double lr = spec.optimizer().lr();
  const v1::LrSchedule& s = spec.lr_schedule();
  const int64_t w = s.warmup_steps();
  if (t < w) return lr * static_cast<double>(t + 1) / static_cast<double>(w);
  const int64_t span = total_steps - w;
  const double p = span > 0 ? std::min(1.0, static_cast<double>(t - w) / static_cast<double>(span)) : 0.0;
  switch (s.decay()) {
    case v1::LR_DECAY_COSINE: return s.min_lr() + 0.5 * (lr - s.min_lr()) * (1 + std::cos(M_PI * p));
    case v1::LR_DECAY_LINEAR: return lr - (lr - s.min_lr()) * p;
    case v1::LR_DECAY_STEP:
      return lr * std::pow(s.gamma(), static_cast<double>((t - w) / std::max<int64_t>(1, s.step_size())));
    default: return lr;
  }
}

double ClipFactor(double max_norm, double norm) { return std::min(1.0, max_norm / (norm + 1e-6)); }

bool LossScaling(const v1::JobSpec& spec) { return spec.loss_scale().dynamic(); }

LossScaleState InitialLossScale(const v1::JobSpec& spec) {
  LossScaleState state;
  state.scale = LossScaling(spec) ? spec.loss_scale().init() : 1;
  return state;
}

void UpdateLossScale(const v1::JobSpec& spec, bool found_inf, LossScaleState* state) {
  const v1::LossScale& ls = spec.loss_scale();
  if (found_inf) {
    state->scale *= ls.backoff_factor();
    state->growth_tracker = 0;
  } else if (++state->growth_tracker >= ls.growth_interval()) {
    state->scale *= ls.growth_factor();
    state->growth_tracker = 0;
  }
}

LossScaleState ReplayLossScale(const v1::JobSpec& spec, const double* norms, int64_t n) {
  LossScaleState state = InitialLossScale(spec);
  if (!LossScaling(spec)) return state;
  for (int64_t i = 0; i < n; ++i) UpdateLossScale(spec, !std::isfinite(norms[i]), &state);
  return state;
}

}  // namespace conveyor
