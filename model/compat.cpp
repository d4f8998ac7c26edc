#include "model/compat.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
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

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define CONVEYOR_FOREACH_NORM_DTYPE 1
#endif

bool ForeachNormTakes(c10::ScalarType dtype) {
#ifdef CONVEYOR_FOREACH_NORM_DTYPE
  return dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf;
#else
  return dtype == at::kFloat;
#endif
}

std::vector<at::Tensor> ForeachNormFp32(const std::vector<at::Tensor>& tensors) {
#ifdef CONVEYOR_FOREACH_NORM_DTYPE
  return at::_foreach_norm(tensors, 2, at::kFloat);
#else
  return at::_foreach_norm(tensors, 2);
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

namespace {

bool AutocastEnabled(c10::DeviceType device) {
#if TORCH_VERSION_MAJOR >= 2
  return at::autocast::is_autocast_enabled(device);
#else
  return device == c10::DeviceType::CUDA ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
#endif
}

at::ScalarType AutocastDtype(c10::DeviceType device) {
#if TORCH_VERSION_MAJOR >= 2
  return at::autocast::get_autocast_dtype(device);
#else
  return device == c10::DeviceType::CUDA ? at::autocast::get_autocast_gpu_dtype()
                                         : at::autocast::get_autocast_cpu_dtype();
#endif
}

void SetAutocast(c10::DeviceType device, bool enabled, at::ScalarType dtype) {
#if TORCH_VERSION_MAJOR >= 2
  at::autocast::set_autocast_dtype(device, dtype);
  at::autocast::set_autocast_enabled(device, enabled);
#else
  if (device == c10::DeviceType::CUDA) {
    at::autocast::set_autocast_gpu_dtype(dtype);
    at::autocast::set_enabled(enabled);
  } else {
    at::autocast::set_autocast_cpu_dtype(dtype);
    at::autocast::set_cpu_enabled(enabled);
  }
#endif
}

}  // namespace

AutocastGuard::AutocastGuard(c10::DeviceType device, at::ScalarType dtype)
    : device_(device), was_enabled_(AutocastEnabled(device)), was_dtype_(AutocastDtype(device)) {
  SetAutocast(device, true, dtype);
}

AutocastGuard::~AutocastGuard() {
  SetAutocast(device_, was_enabled_, was_dtype_);
  if (!was_enabled_) at::autocast::clear_cache();
}

const char* TorchVersion() { return TORCH_VERSION; }

}  // namespace conveyor
