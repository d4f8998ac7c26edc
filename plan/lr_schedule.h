// The arithmetic of an update that the coordinator and the stages share: the
// learning rate of each optimizer step, from the job's optimizer.lr and
// lr_schedule, the clipping factor of a global gradient norm, and the dynamic
// loss scale. Torch-free:
// the stages set them, the coordinator reports and sends them, the reference
// follows them, all from these formulas.
#pragma once

#include <cstdint>

#include "conveyor.pb.h"

namespace conveyor {

// With t the optimizer step counted from 0, W = warmup_steps, T = total
// optimizer steps, lr = optimizer.lr:
//   t < W:              lr * (t + 1) / W
//   then p = (t - W) / (T - W) (0 when T <= W), and by decay:
//     none:             lr
//     cosine:           min_lr + (lr - min_lr) * (1 + cos(pi * p)) / 2
//     linear:           lr - (lr - min_lr) * p
//     step:             lr * gamma ^ floor((t - W) / step_size)
// A resumed job recomputes it from t: the step is the scheduler's whole state.
double LearningRate(const v1::JobSpec& spec, int64_t t, int64_t total_steps);

// torch.nn.utils.clip_grad_norm_'s factor for a global gradient `norm`:
// min(1, max_norm / (norm + 1e-6)). Every stage multiplies its gradients by it.
double ClipFactor(double max_norm, double norm);

// Dynamic loss scaling (loss_scale.dynamic; on by default with precision:
// fp16-mixed): torch.cuda.amp.GradScaler's state and update rule. The
// coordinator keeps it and sends the scale with each step.
struct LossScaleState {
  double scale = 1;
  int64_t growth_tracker = 0;  // finite steps in a row since the last change
};
bool LossScaling(const v1::JobSpec& spec);
LossScaleState InitialLossScale(const v1::JobSpec& spec);  // loss_scale.init
// After a step: found_inf (some gradient was not finite, the step skipped):
// scale *= backoff_factor, tracker = 0; else tracker += 1, and when it reaches
// growth_interval: scale *= growth_factor, tracker = 0.
void UpdateLossScale(const v1::JobSpec& spec, bool found_inf, LossScaleState* state);
// The state after steps whose global gradient norms were `norms`, in order (a
// step whose norm is not finite was skipped): a resumed job's scale, from the
// norms it keeps, with nothing else to save.
LossScaleState ReplayLossScale(const v1::JobSpec& spec, const double* norms, int64_t n);

}  // namespace conveyor
