#include "model/compat.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/version.h>

#include <cmath>
#include <optional>
#include <limits>

namespace conveyor {

at::Tensor CausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
#if TORCH_VERSION_MAJOR >= 2
  return at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true);
#else
  const int64_t t = q.size(-2);
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(q.size(-1)));
  at::Tensor future = at::ones({t, t}, q.options().dtype(at::kBool)).triu(1);
  scores = scores.masked_fill(future, -std::numeric_limits<float>::infinity());
  return at::matmul(at::softmax(scores, -1), v);
#endif
}

std::pair<double, double> EventSpanUs(const torch::autograd::profiler::KinetoEvent& e) {
#if TORCH_VERSION_MAJOR >= 2
  return {static_cast<double>(e.startNs()) * 1e-3, static_cast<double>(e.durationNs()) * 1e-3};
#else
  return {static_cast<double>(e.startUs()), static_cast<double>(e.durationUs())};
#endif
}

bool SetMatmulSmCarveout(int sms) {
#ifdef CONVEYOR_HAS_SM_CARVEOUT
  at::globalContext()._setSMCarveout_EXPERIMENTAL(sms > 0 ? std::optional<int32_t>(sms) : std::nullopt);
  return true;
#else
  return sms == 0;
#endif
}

const char* TorchVersion() { return TORCH_VERSION; }

}  // namespace conveyor
