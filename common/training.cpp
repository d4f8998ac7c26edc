#include "common/training.h"

#include <ATen/ATen.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

namespace conveyor {

at::Tensor ComputeLoss(const v1::JobSpec& spec, const at::Tensor& logits,
                       const at::Tensor& labels, double scale) {
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
  return logits.argmax(1).eq(labels.to(logits.device())).sum().item<int64_t>();
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
