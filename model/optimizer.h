// The optimizer of a job, built from its OptimizerSpec: torch::optim's SGD
// (momentum, Nesterov, weight decay), Adam (L2 weight decay) and AdamW
// (decoupled weight decay), each step as torch.optim's. The stages and the
// reference share it, and so the parameter groups, the learning rate of each
// step and the gradient norm.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "conveyor.pb.h"
#include "model/partition.h"

namespace conveyor {

// Whether `name` (dotted, as state_dict names it) has one of the spec's
// no_decay patterns as a whole component: "bias" matches "3.l.bias", "norm"
// matches "2.norm.weight", neither matches "3.biases".
bool MatchesNoDecay(const v1::OptimizerSpec& spec, const std::string& name);

// The names of the parameters in each group, in model order.
struct ParameterGroups {
  std::vector<std::string> decay, no_decay;
  // "decay (weight_decay 0.1): 2 tensors [1.weight, 3.weight]; no decay: 2 tensors [1.bias, 3.bias]".
  std::string Describe(double weight_decay) const;
};

// The optimizer over `params` (the trainable ones, named): one group with the
// spec's weight_decay and, where parameters match no_decay, a second group
// without it (in that order, as torchtitan and nanoGPT build them).
// `groups`, when given, receives the names in each.
std::unique_ptr<torch::optim::Optimizer> MakeOptimizer(const v1::OptimizerSpec& spec, const NamedTensors& params,
                                                       ParameterGroups* groups = nullptr);

// Sets every group's learning rate (plan/lr_schedule.h computes it).
void SetLearningRate(torch::optim::Optimizer& optimizer, double lr);

// The sum of the squared L2 norms of the gradients of `params` (those without
// one count nothing): each norm in fp32, the sum in double, read once. A
// stage's share of the squared global norm.
double GradSquaredNorm(const std::vector<at::Tensor>& params);
// The same as a double scalar on the gradients' device, nothing read (the
// host does not wait); undefined when no parameter has a gradient. On CUDA
// the gradients' norms are one multi-tensor kernel (`_foreach_norm`), in
// fp32 also for bf16 and fp16 gradients where LibTorch has its dtype form.
at::Tensor GradSquaredNormTensor(const std::vector<at::Tensor>& params);

// Multiplies every gradient of `params` by `factor` in place, as
// torch.nn.utils.clip_grad_norm_ does (ClipFactor in plan/lr_schedule.h).
void ScaleGrads(const std::vector<at::Tensor>& params, double factor);
// The same with clip_grad_norm_'s factor computed on the device from the
// squared norm `sq_norm` (GradSquaredNormTensor): min(1, max_norm / (norm +
// 1e-6)), as ClipFactor, with no wait for the host.
void ClipGradsOnDevice(const std::vector<at::Tensor>& params, double max_norm, const at::Tensor& sq_norm);

// One parameter's optimizer state as named tensors, none before its first
// step: SGD's "momentum_buffer"; Adam's and AdamW's "step" (an int64 scalar
// on the CPU), "exp_avg", "exp_avg_sq" and, with amsgrad, "max_exp_avg_sq".
// What a checkpoint keeps of the optimizer, by parameter, so that it can be
// loaded under another partition of the model (stage_server's resharding).
std::vector<std::pair<std::string, at::Tensor>> ParameterState(const torch::optim::Optimizer& optimizer,
                                                                const at::Tensor& param);
// Sets `param`'s state to `state` (as ParameterState gives it; empty: none
// yet), its tensors copied onto `param`'s device. INVALID_ARGUMENT naming the
// field for a tensor missing or of another shape.
Status SetParameterState(torch::optim::Optimizer& optimizer, const at::Tensor& param,
                         const std::map<std::string, at::Tensor>& state);

// Bytes of the optimizer's state tensors (SGD's momentum buffers, Adam's and
// AdamW's moments): what it holds besides the parameters and gradients.
int64_t OptimizerStateBytes(const torch::optim::Optimizer& optimizer);

}  // namespace conveyor
