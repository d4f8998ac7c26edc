#include "common/training.h"

#include <ATen/ATen.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

namespace conveyor {

at::Tensor ComputeLoss(const v1::JobSpec& spec, const at::Tensor& logits_in,
                       const at::Tensor& labels_in, double scale) {
  // Sequences ([B, T, V] against [B, T]) count every token; bf16 logits are
  // upcast so the loss itself is computed in fp32.
  at::Tensor logits = logits_in.dim() == 3 ? logits_in.flatten(0, 1) : logits_in;
  at::Tensor labels = labels_in.dim() == 2 ? labels_in.flatten() : labels_in;
  if (logits.scalar_type() != at::kFloat && logits.scalar_type() != at::kDouble) logits = logits.to(at::kFloat);
  at::Tensor loss;
  if (spec.loss() == v1::LOSS_MSE) {
    at::Tensor target = at::one_hot(labels, logits.size(1)).to(logits.scalar_type());
    loss = at::mse_loss(logits, target);
  } else {
    loss = at::cross_entropy_loss(logits, labels);
  }
  return scale == 1.0 ? loss : loss * scale;
}

int64_t CountCorrect(const at::Tensor& logits, const at::Tensor& labels) {
  return logits.argmax(-1).eq(labels.to(logits.device())).sum().item<int64_t>();
}

at::Tensor ToModel(const v1::JobSpec& spec, const at::Tensor& inputs, const at::Device& device) {
  if (!at::isFloatingType(inputs.scalar_type())) return inputs.to(device);
  return inputs.to(device, spec.precision() == v1::PRECISION_BF16 ? at::kBFloat16 : at::kFloat);
}

std::unique_ptr<torch::optim::Optimizer> MakeOptimizer(const v1::OptimizerSpec& spec,
                                                       std::vector<at::Tensor> params) {
  if (spec.kind() == v1::OPTIMIZER_ADAM) {
    torch::optim::AdamOptions o(spec.lr());
    o.betas(std::make_tuple(spec.beta1(), spec.beta2())).eps(spec.eps()).weight_decay(spec.weight_decay());
    return std::make_unique<torch::optim::Adam>(std::move(params), o);
  }
  torch::optim::SGDOptions o(spec.lr());
  o.momentum(spec.momentum()).weight_decay(spec.weight_decay());
  return std::make_unique<torch::optim::SGD>(std::move(params), o);
}


}  // namespace conveyor
