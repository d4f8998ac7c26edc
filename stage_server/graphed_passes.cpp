#include "stage_server/graphed_passes.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <string>

namespace conveyor {
namespace {

std::string Name(const char* pass, int chunk, int mb) {
  return std::string(pass) + " of chunk " + std::to_string(chunk) + ", micro-batch " + std::to_string(mb);
}

// Copies `from` into the graph's tensor `into`, which must have its shape.
Status CopyInto(at::Tensor& into, const at::Tensor& from, const char* what) {
  if (into.sizes() != from.sizes() || into.scalar_type() != from.scalar_type()) {
    return absl::InvalidArgumentError(std::string(what) + ": recorded for " + std::string(c10::toString(into.scalar_type())) +
                                      " " + c10::str(into.sizes()) + ", given " +
                                      std::string(c10::toString(from.scalar_type())) + " " + c10::str(from.sizes()));
  }
  at::NoGradGuard no_grad;
  into.detach().copy_(from);
  return absl::OkStatus();
}

}  // namespace

bool GraphedPasses::Available(const at::Device& device) { return DeviceGraph::Create(device) != nullptr; }

StatusOr<GraphedPasses::Forwarded> GraphedPasses::Forward(int chunk, int mb, Partition& layers,
                                                          const at::Tensor& input, bool input_grad,
                                                          const at::Tensor& labels, const Head& head) {
  Pair& p = pairs_[{chunk, mb}];
  if (!p.forward) {
    const std::string what = Name("forward", chunk, mb);
    {
      at::NoGradGuard no_grad;
      p.input = input.detach().clone();
      if (labels.defined()) p.labels = labels.clone();
    }
    if (input_grad) p.input.requires_grad_(true);
    auto graph = DeviceGraph::Create(device_);
    if (!graph) return absl::FailedPreconditionError(what + ": no CUDA graphs on " + device_.str());
    Status forwarded;
    Status st = graph->Capture([&] {
      auto out = layers.ForwardOne(p.input);
      if (!out.ok()) {
        forwarded = out.status();
        return;
      }
      p.output = head ? head(*out, p.labels) : *out;
    });
    if (st.ok()) st = forwarded;
    if (!st.ok()) return Annotate(st, what);
    p.forward = std::move(graph);
  } else {
    Status st = CopyInto(p.input, input, "input");
    if (st.ok() && labels.defined()) st = CopyInto(p.labels, labels, "labels");
    if (!st.ok()) return Annotate(st, Name("forward", chunk, mb));
  }
  p.forward->Replay();
  return Forwarded{p.input, p.output};
}

StatusOr<at::Tensor> GraphedPasses::Backward(int chunk, int mb, const at::Tensor& grad,
                                             const std::vector<at::Tensor>& params) {
  auto it = pairs_.find({chunk, mb});
  if (it == pairs_.end() || !it->second.forward)
    return absl::InternalError(Name("backward", chunk, mb) + " before its forward");
  Pair& p = it->second;
  const bool input_grad = p.input.requires_grad();
  if (!p.backward) {
    const std::string what = Name("backward", chunk, mb);
    {
      // Accumulation in place needs the gradients to exist before capture.
      at::NoGradGuard no_grad;
      for (const at::Tensor& param : params)
        if (param.requires_grad() && !param.grad().defined()) param.mutable_grad() = at::zeros_like(param);
      if (input_grad) p.input.mutable_grad() = at::zeros_like(p.input);
      if (grad.defined()) p.grad = grad.detach().clone();
    }
    auto graph = DeviceGraph::Create(device_);
    if (!graph) return absl::FailedPreconditionError(what + ": no CUDA graphs on " + device_.str());
    Status st = graph->Capture(
        [&] {
          if (input_grad) p.input.mutable_grad().zero_();
          std::vector<at::Tensor> grads;
          if (p.grad.defined()) grads.push_back(p.grad);
          // Kept: every replay of the forward rewrites what it saved.
          torch::autograd::backward({p.output}, grads, /*retain_graph=*/true);
        },
        p.forward.get());
    if (!st.ok()) return Annotate(st, what);
    p.backward = std::move(graph);
  } else if (grad.defined()) {
    Status st = CopyInto(p.grad, grad, "gradient");
    if (!st.ok()) return Annotate(st, Name("backward", chunk, mb));
  }
  p.backward->Replay();
  return input_grad ? p.input.grad() : at::Tensor();
}

void GraphedPasses::ZeroGrads(const std::vector<at::Tensor>& params) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> grads;
  for (const at::Tensor& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  if (!grads.empty()) at::_foreach_zero_(grads);  // a few multi-tensor kernels, not one per tensor
}

}  // namespace conveyor
