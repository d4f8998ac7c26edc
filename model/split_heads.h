// Attention's q, k and v split from the qkv projection with a backward of
// Conveyor's own: the zoo's gpt (model/blocks.h) and exported programs whose
// graph splits the projection as nanoGPT does (model/exported/fusions.cpp).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace conveyor {

// [B, T, 3 * heads * D] -> q, k, v as [B, heads, T, D] views: what
// `qkv.view(B, T, 3, heads, D).permute(2, 0, 3, 1, 4).unbind(0)` gives,
// whose backward writes the three gradients straight into one
// [B, T, 3 * heads * D] tensor (unbind's stacks them, [3, B, heads, T, D],
// and the view's backward copies that again). The same numbers.
std::vector<at::Tensor> SplitHeads(const at::Tensor& qkv, int64_t heads);

}  // namespace conveyor
