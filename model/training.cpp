#include "model/training.h"

#include <ATen/ATen.h>

#include "model/dataset.h"

namespace conveyor {

at::Tensor ComputeLoss(const v1::JobSpec& spec, const at::Tensor& logits_in,
                       const at::Tensor& labels_in, double scale) {
  // bf16 outputs are upcast so the loss itself is computed in fp32.
  auto fp32 = [](const at::Tensor& t) {
    return t.scalar_type() != at::kFloat && t.scalar_type() != at::kDouble ? t.to(at::kFloat) : t;
  };
  at::Tensor loss;
  const bool class_targets = !at::isFloatingType(labels_in.scalar_type());
  if (spec.loss() == v1::LOSS_BCE_WITH_LOGITS) {
    at::Tensor logits = fp32(logits_in);
    loss = at::binary_cross_entropy_with_logits(logits, labels_in.to(logits.scalar_type()));
  } else if (spec.loss() == v1::LOSS_MSE && !class_targets) {
    at::Tensor out = fp32(logits_in);
    loss = at::mse_loss(out, labels_in.to(out.scalar_type()));
  } else {
    // Sequences ([B, T, V] against [B, T]) count every token, as
    // cross_entropy(out.reshape(-1, V), y.reshape(-1)) does.
    at::Tensor logits = fp32(logits_in.dim() >= 3 ? logits_in.flatten(0, -2) : logits_in);
    at::Tensor labels = labels_in.dim() >= 2 ? labels_in.flatten() : labels_in;
    if (spec.loss() == v1::LOSS_MSE) {
      loss = at::mse_loss(logits, at::one_hot(labels, logits.size(1)).to(logits.scalar_type()));
    } else if (spec.loss() == v1::LOSS_NLL) {
      loss = at::nll_loss(logits, labels);
    } else {
      loss = at::cross_entropy_loss(logits, labels);
    }
  }
  return scale == 1.0 ? loss : loss * scale;
}

ForwardPrecision::ForwardPrecision(const v1::JobSpec& spec, const at::Device& device) {
  if (spec.precision() == v1::PRECISION_BF16_MIXED) autocast_.emplace(device.type(), at::kBFloat16);
}

int64_t CountCorrect(const at::Tensor& logits, const at::Tensor& labels) {
  if (at::isFloatingType(labels.scalar_type())) return 0;  // no classes to be right about
  return logits.argmax(-1).eq(labels.to(logits.device())).sum().item<int64_t>();
}

at::Tensor ToModel(const v1::JobSpec& spec, const at::Tensor& inputs, const at::Device& device) {
  // Moved first, converted on the device: a conversion on the way would be
  // done by the host, into pageable memory.
  const bool async = device.is_cuda() && inputs.is_pinned();
  at::Tensor x = inputs.to(device, /*non_blocking=*/async);
  if (!at::isFloatingType(x.scalar_type())) return x;
  return x.to(spec.precision() == v1::PRECISION_BF16 ? at::kBFloat16 : at::kFloat);
}

BatchLoader::BatchLoader(const v1::JobSpec& spec, Dataset* data, const at::Device& device, bool inputs, bool labels)
    : spec_(spec), data_(data), device_(device), inputs_(inputs), labels_(labels) {}

BatchLoader::~BatchLoader() {
  if (ahead_) ahead_->batch.wait();  // the gather reads *data_
}

BatchLoader::Batch BatchLoader::Gather(v1::Phase phase, int64_t step) const {
  Batch b;
  const bool pinned = device_.is_cuda();
  if (inputs_) b.inputs = data_->Inputs(phase, step, pinned);
  if (labels_) b.labels = data_->Labels(phase, step, pinned);
  return b;
}

void BatchLoader::Prefetch(v1::Phase phase, int64_t step) {
  if (!device_.is_cuda() || (phase == v1::PHASE_EVAL && step >= data_->EvalBatches())) return;
  if (ahead_) ahead_->batch.wait();
  ahead_ = Ahead{phase, step, std::async(std::launch::async, [this, phase, step] { return Gather(phase, step); })};
}

BatchLoader::Batch BatchLoader::Get(v1::Phase phase, int64_t step) {
  Batch host;
  if (ahead_ && ahead_->phase == phase && ahead_->step == step) {
    host = ahead_->batch.get();  // rethrows what the gather threw
  } else {
    if (ahead_) ahead_->batch.wait();
    host = Gather(phase, step);
  }
  ahead_.reset();
  Batch b;
  if (host.inputs.defined()) b.inputs = ToModel(spec_, host.inputs, device_);
  if (host.labels.defined()) b.labels = host.labels.to(device_, /*non_blocking=*/device_.is_cuda());
  return b;
}

}  // namespace conveyor
