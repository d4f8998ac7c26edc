#include "model/models.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/pooling.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/normalization.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "model/blocks.h"
#include "plan/model_catalog.h"

namespace conveyor {
namespace {

namespace nn = torch::nn;

// Layer `index` of the model, default-initialised.
nn::AnyModule MakeLayer(const v1::JobSpec& spec, int index) {
  const v1::ModelSpec& m = spec.model();
  switch (m.kind()) {
    case v1::MODEL_TOY: {
      switch (index) {
        case 0: return nn::AnyModule(Dense(10, 10));
        case 1: return nn::AnyModule(nn::ReLU());
        default: return nn::AnyModule(Dense(10, 5));
      }
    }
    case v1::MODEL_CONVNET: {
      switch (index) {
        case 0: return nn::AnyModule(nn::Conv2d(nn::Conv2dOptions(1, 6, 5)));
        case 3: return nn::AnyModule(nn::Conv2d(nn::Conv2dOptions(6, 16, 5)));
        case 1: case 4: case 8: case 10: return nn::AnyModule(nn::ReLU());
        case 2: case 5: return nn::AnyModule(nn::MaxPool2d(nn::MaxPool2dOptions(2)));
        case 6: return nn::AnyModule(nn::Flatten());
        case 7: return nn::AnyModule(Dense(16 * 4 * 4, 120));
        case 9: return nn::AnyModule(Dense(120, 84));
        default: return nn::AnyModule(Dense(84, NumClasses(m)));
      }
    }
    case v1::MODEL_RESNET50: {
      // conv1, bn1, relu, maxpool, layer1..layer4 as 3, 4, 6, 3 bottlenecks, avgpool, flatten, fc
      static const int kBlocks[] = {3, 4, 6, 3};
      if (index == 0) return nn::AnyModule(nn::Conv2d(nn::Conv2dOptions(3, 64, 7).stride(2).padding(3).bias(false)));
      if (index == 1) return nn::AnyModule(nn::BatchNorm2d(64));
      if (index == 2) return nn::AnyModule(nn::ReLU());
      if (index == 3) return nn::AnyModule(nn::MaxPool2d(nn::MaxPool2dOptions(3).stride(2).padding(1)));
      int k = index - 4;
      for (int stage = 0; stage < 4; ++stage) {
        if (k < kBlocks[stage]) {
          const int64_t planes = 64 << stage;
          const int64_t in = k == 0 ? (stage == 0 ? 64 : planes * 2) : planes * 4;
          return nn::AnyModule(Bottleneck(in, planes, k == 0 && stage > 0 ? 2 : 1));
        }
        k -= kBlocks[stage];
      }
      if (k == 0) return nn::AnyModule(nn::AdaptiveAvgPool2d(nn::AdaptiveAvgPool2dOptions(1)));
      if (k == 1) return nn::AnyModule(nn::Flatten());
      return nn::AnyModule(Dense(2048, NumClasses(m)));
    }
    case v1::MODEL_GPT: {
      if (index == 0) return nn::AnyModule(TokenEmbedding(m.vocab(), m.width(), m.seq_len()));
      if (index <= m.blocks()) return nn::AnyModule(DecoderBlock(m.width(), m.heads(), m.mlp_width(), !m.unfused_qkv()));
      if (index == m.blocks() + 1) return nn::AnyModule(nn::LayerNorm(nn::LayerNormOptions({m.width()})));
      return nn::AnyModule(Dense(m.width(), m.vocab()));
    }
    case v1::MODEL_MLP: {
      if (index == 0) return nn::AnyModule(nn::Flatten());
      int k = index - 1;  // position after the Flatten
      if (k % 2 == 1) return nn::AnyModule(nn::ReLU());
      int in = k == 0 ? (m.input_dim() > 0 ? m.input_dim() : 784) : m.hidden(k / 2 - 1);
      int out = k / 2 < m.hidden_size() ? m.hidden(k / 2) : NumClasses(m);
      return nn::AnyModule(Dense(in, out));
    }
    default:
      TORCH_CHECK(false, "unknown model");
  }
}

// Linear and convolution weights and biases: U(-1/sqrt(fan_in), 1/sqrt(fan_in)),
// PyTorch's default; embeddings N(0, 1); norms keep their ones and zeros. All
// drawn from the layer's own generator, in registration order.
void InitLayer(nn::Module& layer, uint64_t seed, int index) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(
      seed * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(index) + 1);
  at::NoGradGuard no_grad;
  for (const auto& module : layer.modules(/*include_self=*/true)) {
    const bool dense = module->as<Dense>() || module->as<nn::Linear>() || module->as<nn::Conv2d>();
    if (dense) {
      at::Tensor w = module->named_parameters(false)["weight"];
      const double bound = 1.0 / std::sqrt(static_cast<double>(w.numel() / w.size(0)));
      for (auto& p : module->named_parameters(/*recurse=*/false)) p.value().uniform_(-bound, bound, gen);
    } else if (module->as<nn::Embedding>()) {
      module->named_parameters(false)["weight"].normal_(0.0, 1.0, gen);
    }
  }
}

}  // namespace

StatusOr<torch::nn::Sequential> BuildLayers(const v1::JobSpec& spec, int begin, int end, bool init) {
  const int layers = NumLayers(spec.model());
  if (layers == 0) return absl::InvalidArgumentError("unknown model");
  if (begin < 0 || end > layers || begin >= end) {
    return absl::InvalidArgumentError("layer range [" + std::to_string(begin) + ", " +
                                      std::to_string(end) + ") is not within the model's " +
                                      std::to_string(layers) + " layers");
  }
  try {
    // Each layer is made and drawn from its own generator: on threads of
    // their own, the same values in any order (W2's 26 layers took 23 s on
    // one thread before an H100 started, 2026-11-27).
    std::vector<nn::AnyModule> made(static_cast<std::size_t>(end - begin));
    std::atomic<int> next{begin};
    std::exception_ptr failed;
    std::mutex failed_mu;
    auto work = [&] {
      for (int i = next++; i < end; i = next++) {
        try {
          nn::AnyModule layer = MakeLayer(spec, i);
          if (init) InitLayer(*layer.ptr(), spec.seed(), i);
          made[static_cast<std::size_t>(i - begin)] = std::move(layer);
        } catch (...) {
          std::lock_guard<std::mutex> lock(failed_mu);
          if (!failed) failed = std::current_exception();
        }
      }
    };
    const int threads = std::min<int>(end - begin, std::max(1u, std::thread::hardware_concurrency()));
    std::vector<std::thread> workers;
    for (int t = 1; t < threads; ++t) workers.emplace_back(work);
    work();
    for (std::thread& w : workers) w.join();
    if (failed) std::rethrow_exception(failed);
    nn::Sequential seq;
    for (int i = begin; i < end; ++i) seq->push_back(std::to_string(i), std::move(made[static_cast<std::size_t>(i - begin)]));
    if (spec.precision() == v1::PRECISION_BF16) seq->to(at::kBFloat16);
    return seq;
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(std::string("building the model: ") + e.what_without_backtrace());
  }
}

}  // namespace conveyor
