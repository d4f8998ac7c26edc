// The arithmetic of a training step that both the stages and the reference
// share: loss, accuracy and the optimizer, built from the job spec.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include <memory>
#include <vector>

#include "conveyor.pb.h"

namespace conveyor {

// The loss of one micro-batch scaled by `scale` (its share of the mini-batch),
// so that the sum over micro-batches is the mini-batch's mean loss. Logits
// [B, C] or [B, T, C] (sequences: every token counts).
at::Tensor ComputeLoss(const v1::JobSpec& spec, const at::Tensor& logits,
                       const at::Tensor& labels, double scale);

// Correct predictions: one per sample, or one per token of a sequence.
int64_t CountCorrect(const at::Tensor& logits, const at::Tensor& labels);

// A batch of model inputs on `device`, floating inputs in the job's precision.
at::Tensor ToModel(const v1::JobSpec& spec, const at::Tensor& inputs, const at::Device& device);

std::unique_ptr<torch::optim::Optimizer> MakeOptimizer(const v1::OptimizerSpec& spec,
                                                       std::vector<at::Tensor> params);

}  // namespace conveyor
