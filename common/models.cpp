#include "common/models.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/pooling.h>
#include <torch/nn/modules/container/functional.h>

#include <cmath>

#include "common/model_catalog.h"

namespace conveyor {
namespace {

namespace nn = torch::nn;

int Classes(const v1::ModelSpec& m, int fallback) {
  return m.num_classes() > 0 ? m.num_classes() : fallback;
}

// Layer `index` of the model, default-initialised.
nn::AnyModule MakeLayer(const v1::JobSpec& spec, int index) {
  const v1::ModelSpec& m = spec.model();
  switch (m.kind()) {
    case v1::MODEL_TOY: {
      switch (index) {
        case 0: return nn::AnyModule(nn::Linear(10, 10));
        case 1: return nn::AnyModule(nn::ReLU());
        default: return nn::AnyModule(nn::Linear(10, 5));
      }
    }
    case v1::MODEL_CONVNET: {
      switch (index) {
        case 0: return nn::AnyModule(nn::Conv2d(nn::Conv2dOptions(1, 6, 5)));
        case 3: return nn::AnyModule(nn::Conv2d(nn::Conv2dOptions(6, 16, 5)));
        case 1: case 4: case 8: case 10: return nn::AnyModule(nn::ReLU());
        case 2: case 5: return nn::AnyModule(nn::MaxPool2d(nn::MaxPool2dOptions(2)));
        case 6: return nn::AnyModule(nn::Flatten());
        case 7: return nn::AnyModule(nn::Linear(16 * 4 * 4, 120));
        case 9: return nn::AnyModule(nn::Linear(120, 84));
        default: return nn::AnyModule(nn::Linear(84, Classes(m, 10)));
      }
    }
    case v1::MODEL_MLP: {
      if (index == 0) return nn::AnyModule(nn::Flatten());
      int k = index - 1;  // position after the Flatten
      if (k % 2 == 1) return nn::AnyModule(nn::ReLU());
      int in = k == 0 ? (m.input_dim() > 0 ? m.input_dim() : 784) : m.hidden(k / 2 - 1);
      int out = k / 2 < m.hidden_size() ? m.hidden(k / 2) : Classes(m, 10);
      return nn::AnyModule(nn::Linear(in, out));
    }
    default:
      TORCH_CHECK(false, "unknown model");
  }
}

// U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weights and biases, PyTorch's default
// for Linear and Conv, drawn from the layer's own generator.
void InitLayer(nn::Module& layer, uint64_t seed, int index) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(
      seed * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(index) + 1);
  at::NoGradGuard no_grad;
  double bound = 0;
  for (auto& p : layer.named_parameters(/*recurse=*/true)) {
    at::Tensor t = p.value();
    if (p.key() == "weight" && t.dim() >= 2) {
      bound = 1.0 / std::sqrt(static_cast<double>(t.numel() / t.size(0)));
    } else if (bound == 0) {
      bound = 1.0 / std::sqrt(static_cast<double>(t.numel()));
    }
    t.uniform_(-bound, bound, gen);
  }
}

}  // namespace

StatusOr<torch::nn::Sequential> BuildLayers(const v1::JobSpec& spec, int begin, int end) {
  const int layers = NumLayers(spec.model());
  if (layers == 0) return absl::InvalidArgumentError("unknown model");
  if (begin < 0 || end > layers || begin >= end) {
    return absl::InvalidArgumentError("layer range [" + std::to_string(begin) + ", " +
                                      std::to_string(end) + ") is not within the model's " +
                                      std::to_string(layers) + " layers");
  }
  try {
    nn::Sequential seq;
    for (int i = begin; i < end; ++i) {
      nn::AnyModule layer = MakeLayer(spec, i);
      InitLayer(*layer.ptr(), spec.seed(), i);
      seq->push_back(std::to_string(i), std::move(layer));
    }
    return seq;
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(std::string("building the model: ") + e.what_without_backtrace());
  }
}

std::vector<std::pair<std::string, at::Tensor>> NamedParameters(const torch::nn::Sequential& layers) {
  // Children are named by their model-wide index (see BuildLayers).
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& child : layers->named_children()) {
    for (const auto& p : child.value()->named_parameters(true))
      out.emplace_back(child.key() + "." + p.key(), p.value());
  }
  return out;
}

}  // namespace conveyor
