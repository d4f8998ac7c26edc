#include "model/training.h"

#include <ATen/ATen.h>
#include <sys/stat.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>
#include <torch/script.h>

#include <map>
#include <memory>
#include <mutex>

#include "model/dataset.h"
#include "model/partition.h"
#include "transport/tensor_codec.h"

namespace conveyor {

namespace {

// loss: {torchscript: PATH}'s modules, loaded once per process and path.
// Guarded by `mu`; a module is called by one thread at a time (a stage's
// executor, the reference's loop).
struct ScriptedLosses {
  std::mutex mu;
  std::map<std::string, std::shared_ptr<torch::jit::Module>> by_path;
};

ScriptedLosses& Losses() {
  static ScriptedLosses* losses = new ScriptedLosses();  // never destroyed: used until exit
  return *losses;
}

std::string FirstLine(const std::string& s) { return s.substr(0, s.find('\n')); }

StatusOr<std::shared_ptr<torch::jit::Module>> ScriptedLoss(const std::string& path) {
  ScriptedLosses& losses = Losses();
  std::lock_guard<std::mutex> lock(losses.mu);
  auto it = losses.by_path.find(path);
  if (it != losses.by_path.end()) return it->second;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return absl::NotFoundError("loss.torchscript: " + path + " does not exist");
  try {
    auto m = std::make_shared<torch::jit::Module>(torch::jit::load(path, c10::Device(c10::kCPU)));
    if (!m->find_method("forward"))
      return absl::InvalidArgumentError("loss.torchscript: " + path + " has no forward(output, target)");
    m->eval();
    losses.by_path.emplace(path, m);
    return m;
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError("loss.torchscript: " + path + " is not a TorchScript archive (" +
                                      FirstLine(e.what()) + ")");
  }
}

// The scripted loss of (output, target): a scalar, or a c10::Error naming
// the file and what it returned.
at::Tensor RunScriptedLoss(const std::string& path, const at::Tensor& output, const at::Tensor& target) {
  auto m = ScriptedLoss(path);
  TORCH_CHECK(m.ok(), std::string(m.status().message()));
  auto& module = **m;
  module.to(output.device());  // its buffers (class weights), if any, where the output is; cheap when there
  c10::IValue out = module.forward({output, target});
  TORCH_CHECK(out.isTensor(), "loss.torchscript: ", path, " returns ", out.type()->str(),
              ", not a tensor: it must return the mean loss over its batch, a scalar");
  at::Tensor loss = out.toTensor();
  TORCH_CHECK(loss.dim() == 0 && loss.is_floating_point(), "loss.torchscript: ", path,
              " returns a tensor of shape ", loss.sizes(), " and dtype ", loss.scalar_type(),
              ": it must return the mean loss over its batch, a floating-point scalar");
  return loss;
}

}  // namespace

Status CheckLoss(const v1::JobSpec& spec, const std::vector<int64_t>& output_sample_shape) {
  if (spec.loss_torchscript().empty()) return absl::OkStatus();
  CONVEYOR_RETURN_IF_ERROR(ScriptedLoss(spec.loss_torchscript()).status());
  // Two samples of zeros: class 0 for class targets, where the data file
  // does not say (synthetic data, Fashion-MNIST).
  std::vector<int64_t> out_shape{2}, target_shape{2};
  out_shape.insert(out_shape.end(), output_sample_shape.begin(), output_sample_shape.end());
  const v1::DataSpec& d = spec.data();
  at::ScalarType target_type = at::kLong;
  if (d.target_dtype() != v1::DTYPE_UNSPECIFIED) {
    target_type = FromWireDType(d.target_dtype());
    target_shape.insert(target_shape.end(), d.target_sample_shape().begin(), d.target_sample_shape().end());
  }
  try {
    RunScriptedLoss(spec.loss_torchscript(), at::zeros(out_shape), at::zeros(target_shape, at::dtype(target_type)));
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    if (what.rfind("loss.torchscript: ", 0) == 0) return absl::InvalidArgumentError(FirstLine(what));
    return absl::InvalidArgumentError("loss.torchscript: " + spec.loss_torchscript() + " fails on outputs of shape " +
                                      c10::str(at::IntArrayRef(out_shape)) + " and targets of shape " +
                                      c10::str(at::IntArrayRef(target_shape)) + ": " + FirstLine(what));
  }
  return absl::OkStatus();
}

at::Tensor ComputeLoss(const v1::JobSpec& spec, const at::Tensor& logits_in,
                       const at::Tensor& labels_in, double scale) {
  // bf16 outputs are upcast so the loss itself is computed in fp32.
  auto fp32 = [](const at::Tensor& t) {
    return t.scalar_type() != at::kFloat && t.scalar_type() != at::kDouble ? t.to(at::kFloat) : t;
  };
  at::Tensor loss;
  const bool class_targets = !at::isFloatingType(labels_in.scalar_type());
  if (!spec.loss_torchscript().empty()) {
    loss = RunScriptedLoss(spec.loss_torchscript(), fp32(logits_in), labels_in);
  } else if (spec.loss() == v1::LOSS_BCE_WITH_LOGITS) {
    at::Tensor logits = fp32(logits_in);
    loss = at::binary_cross_entropy_with_logits(logits, labels_in.to(logits.scalar_type()));
  } else if (spec.loss() == v1::LOSS_MSE && !class_targets) {
    at::Tensor out = fp32(logits_in);
    loss = at::mse_loss(out, labels_in.to(out.scalar_type()));
  } else {
    // Sequences ([B, T, V] against [B, T]) count every token, as
    // cross_entropy(out.reshape(-1, V), y.reshape(-1)) does.
    at::Tensor flat = logits_in.dim() >= 3 ? logits_in.flatten(0, -2) : logits_in;
    at::Tensor labels = labels_in.dim() >= 2 ? labels_in.flatten() : labels_in;
    if (spec.loss() == v1::LOSS_CROSS_ENTROPY || spec.loss() == v1::LOSS_UNSPECIFIED) {
      // cross_entropy(logits.float()) as log_softmax to fp32, then nll_loss:
      // the same arithmetic (the softmax upcasts each bf16 value as it reads
      // it), without an fp32 copy of the logits (on W2: 4 GB a step, 3 ms).
      const at::ScalarType to = flat.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
      loss = at::nll_loss(at::log_softmax(flat, -1, to), labels);
    } else if (spec.loss() == v1::LOSS_MSE) {
      at::Tensor logits = fp32(flat);
      loss = at::mse_loss(logits, at::one_hot(labels, logits.size(1)).to(logits.scalar_type()));
    } else {
      loss = at::nll_loss(fp32(flat), labels);
    }
  }
  return scale == 1.0 ? loss : loss * scale;
}

ForwardPrecision::ForwardPrecision(const v1::JobSpec& spec, const at::Device& device) {
  if (spec.precision() == v1::PRECISION_BF16_MIXED) autocast_.emplace(device.type(), at::kBFloat16);
  if (spec.precision() == v1::PRECISION_FP16_MIXED) autocast_.emplace(device.type(), at::kHalf);
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
    : spec_(spec),
      data_(data),
      device_(device),
      inputs_(inputs),
      labels_(labels),
      channels_last_(UsesChannelsLast(spec, device)) {}

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
  ahead_ = Ahead{phase, step, std::async(std::launch::async, [this, phase, step] {
                   const Batch host = Gather(phase, step);
                   Loaded loaded;
                   loaded.copy = RunOnSideStream(device_, [&] { loaded.batch = ToDevice(host); });
                   return loaded;
                 })};
}

BatchLoader::Batch BatchLoader::ToDevice(const Batch& host) const {
  Batch b;
  if (host.inputs.defined()) b.inputs = ToModel(spec_, host.inputs, device_);
  if (channels_last_ && b.inputs.dim() == 4) b.inputs = b.inputs.contiguous(at::MemoryFormat::ChannelsLast);
  if (host.labels.defined()) b.labels = host.labels.to(device_, /*non_blocking=*/device_.is_cuda());
  return b;
}

BatchLoader::Batch BatchLoader::Get(v1::Phase phase, int64_t step) {
  if (ahead_ && ahead_->phase == phase && ahead_->step == step) {
    Loaded loaded = ahead_->batch.get();  // rethrows what the gather threw
    ahead_.reset();
    if (loaded.copy) loaded.copy->Join({loaded.batch.inputs, loaded.batch.labels});
    return loaded.batch;
  }
  // Another step's (its side-stream tensors are freed in that stream's order).
  if (ahead_) ahead_->batch.wait();
  ahead_.reset();
  return ToDevice(Gather(phase, step));
}

}  // namespace conveyor
