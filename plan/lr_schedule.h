// The arithmetic of an update that the coordinator and the stages share: the
// learning rate of each optimizer step, from the job's optimizer.lr and
// lr_schedule, and the clipping factor of a global gradient norm. Torch-free:
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

}  // namespace conveyor
