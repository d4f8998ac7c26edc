// The differences between the LibTorch versions Conveyor builds against
// (Debian's 1.13 and the 2.x inside PyTorch wheels), in one place.
#pragma once

#include <ATen/core/Tensor.h>

#include <utility>

namespace torch::autograd::profiler {
struct KinetoEvent;
}

namespace conveyor {

// Causal self-attention over [batch, heads, tokens, head_dim]: the fused
// scaled_dot_product_attention on LibTorch 2.x, a plain one on 1.13.
at::Tensor CausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

// A profiled event's start and duration in microseconds (1.13 counts in
// microseconds, 2.x in nanoseconds).
std::pair<double, double> EventSpanUs(const torch::autograd::profiler::KinetoEvent& e);

// Makes later matmuls on CUDA leave `sms` of the device's SMs free (0: use
// them all), for the NCCL kernels that run beside them: a matmul sized for
// every SM otherwise waits for the SMs they hold, up to twice as long.
// False where this LibTorch cannot (before 2.7).
bool SetMatmulSmCarveout(int sms);

// "1.13.1", "2.11.0", ...
const char* TorchVersion();

}  // namespace conveyor
