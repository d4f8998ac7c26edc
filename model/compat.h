// The differences between the LibTorch versions Conveyor builds against
// (Debian's 1.13 and the 2.x inside PyTorch wheels), in one place.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <utility>
#include <vector>

namespace torch::autograd::profiler {
struct KinetoEvent;
}

namespace conveyor {

// Causal self-attention over [batch, heads, tokens, head_dim]: the fused
// scaled_dot_product_attention on LibTorch 2.x, a plain one on 1.13.
at::Tensor CausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

// Each tensor's 2-norm, accumulated and returned in fp32, by one
// multi-tensor kernel (_foreach_norm). Reduced-precision tensors need its
// dtype form (LibTorch 2.4 on): ForeachNormTakes says which dtypes this
// build's _foreach_norm takes.
bool ForeachNormTakes(c10::ScalarType dtype);
std::vector<at::Tensor> ForeachNormFp32(const std::vector<at::Tensor>& tensors);

// A profiled event's start and duration in microseconds (1.13 counts in
// microseconds, 2.x in nanoseconds).
std::pair<double, double> EventSpanUs(const torch::autograd::profiler::KinetoEvent& e);

// Makes later matmuls on CUDA leave `sms` of the device's SMs free (0: use
// them all), for the NCCL kernels that run beside them: a matmul sized for
// every SM otherwise waits for the SMs they hold, up to twice as long.
// False where this LibTorch cannot (before 2.7).
bool SetMatmulSmCarveout(int sms);

// torch.autocast(device_type, dtype) on this thread while it lives: ops
// eligible for lower precision run in `dtype`, as PyTorch's autocast runs
// them (1.13: set_cpu_enabled / set_autocast_cpu_dtype and set_enabled /
// set_autocast_gpu_dtype; 2.x: set_autocast_enabled / set_autocast_dtype by
// device type). Its end puts the state before back and, as leaving
// torch.autocast does, drops the cache of casted weights, so that a cast made
// before an optimizer step (or under no_grad) is never used after it.
// Not copyable; one thread.
class AutocastGuard {
 public:
  AutocastGuard(c10::DeviceType device, at::ScalarType dtype);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  c10::DeviceType device_;
  bool was_enabled_;
  at::ScalarType was_dtype_;
};

// "1.13.1", "2.11.0", ...
const char* TorchVersion();

}  // namespace conveyor
