#include "model/blocks.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "model/compat.h"
#include "model/split_heads.h"

namespace conveyor {

namespace nn = torch::nn;

void DenseImpl::reset() {
  weight = register_parameter("weight", at::zeros({out_, in_}));
  bias = register_parameter("bias", at::zeros({out_}));
}

at::Tensor DenseImpl::forward(const at::Tensor& x) { return at::linear(x, weight, bias); }

BottleneckImpl::BottleneckImpl(int64_t in_planes, int64_t planes, int64_t stride) {
  const int64_t out = planes * 4;
  conv1_ = register_module("conv1", nn::Conv2d(nn::Conv2dOptions(in_planes, planes, 1).bias(false)));
  bn1_ = register_module("bn1", nn::BatchNorm2d(planes));
  conv2_ = register_module(
      "conv2", nn::Conv2d(nn::Conv2dOptions(planes, planes, 3).stride(stride).padding(1).bias(false)));
  bn2_ = register_module("bn2", nn::BatchNorm2d(planes));
  conv3_ = register_module("conv3", nn::Conv2d(nn::Conv2dOptions(planes, out, 1).bias(false)));
  bn3_ = register_module("bn3", nn::BatchNorm2d(out));
  if (stride != 1 || in_planes != out) {
    downsample_ = register_module(
        "downsample", nn::Sequential(nn::Conv2d(nn::Conv2dOptions(in_planes, out, 1).stride(stride).bias(false)),
                                     nn::BatchNorm2d(out)));
  }
}

at::Tensor BottleneckImpl::forward(const at::Tensor& x) {
  at::Tensor y = at::relu(bn1_->forward(conv1_->forward(x)));
  y = at::relu(bn2_->forward(conv2_->forward(y)));
  y = bn3_->forward(conv3_->forward(y));
  return at::relu(y + (downsample_ ? downsample_->forward(x) : x));
}

TokenEmbeddingImpl::TokenEmbeddingImpl(int64_t vocab, int64_t width, int64_t max_tokens) {
  tokens_ = register_module("tokens", nn::Embedding(vocab, width));
  positions_ = register_module("positions", nn::Embedding(max_tokens, width));
}

at::Tensor TokenEmbeddingImpl::forward(const at::Tensor& tokens) {
  at::Tensor pos = at::arange(tokens.size(1), tokens.options().dtype(at::kLong));
  return tokens_->forward(tokens) + positions_->forward(pos);
}

namespace {

// The views are of the input; their gradients land in a fresh tensor of the
// input's layout, each by one strided copy (unbind's backward would stack
// them, [3, B, heads, T, D], and the view's backward copy that again).
struct SplitHeadsFn : public torch::autograd::Function<SplitHeadsFn> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& qkv,
                                                int64_t heads) {
    const int64_t b = qkv.size(0), t = qkv.size(1), d = qkv.size(2) / (3 * heads);
    ctx->saved_data["shape"] = std::vector<int64_t>{b, t, 3, heads, d};
    std::vector<at::Tensor> parts = qkv.view({b, t, 3, heads, d}).permute({2, 0, 3, 1, 4}).unbind(0);
    return {parts[0], parts[1], parts[2]};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const std::vector<int64_t> shape = ctx->saved_data["shape"].toIntVector();
    at::Tensor out;
    for (const at::Tensor& g : grads) {
      if (g.defined()) out = at::empty(shape, g.options());
    }
    if (!out.defined()) return {at::Tensor(), at::Tensor()};
    for (int i = 0; i < 3; ++i) {
      at::Tensor part = out.select(2, i);  // [B, T, heads, D]
      if (grads[i].defined()) {
        part.copy_(grads[i].transpose(1, 2));
      } else {
        part.zero_();
      }
    }
    return {out.view({shape[0], shape[1], shape[2] * shape[3] * shape[4]}), at::Tensor()};
  }
};

}  // namespace

std::vector<at::Tensor> SplitHeads(const at::Tensor& qkv, int64_t heads) { return SplitHeadsFn::apply(qkv, heads); }

DecoderBlockImpl::DecoderBlockImpl(int64_t width, int64_t heads, int64_t mlp_width, bool fused_qkv)
    : heads_(heads), fused_qkv_(fused_qkv) {
  norm1_ = register_module("norm1", nn::LayerNorm(nn::LayerNormOptions({width})));
  qkv_ = register_module("qkv", Dense(width, 3 * width));
  proj_ = register_module("proj", Dense(width, width));
  norm2_ = register_module("norm2", nn::LayerNorm(nn::LayerNormOptions({width})));
  fc1_ = register_module("fc1", Dense(width, mlp_width));
  fc2_ = register_module("fc2", Dense(mlp_width, width));
}

at::Tensor DecoderBlockImpl::forward(const at::Tensor& x) {
  const int64_t b = x.size(0), t = x.size(1), w = x.size(2);
  // [B, T, 3W] -> 3 x [B, heads, T, W / heads]. Unfused: unbind, not three
  // selects (its backward stacks the three gradients once instead of
  // zero-filling and summing three full-size copies).
  const at::Tensor projected = qkv_->forward(norm1_->forward(x));
  std::vector<at::Tensor> qkv =
      fused_qkv_ ? SplitHeads(projected, heads_)
                 : projected.view({b, t, 3, heads_, w / heads_}).permute({2, 0, 3, 1, 4}).unbind(0);
  at::Tensor attn = CausalAttention(qkv[0], qkv[1], qkv[2]).transpose(1, 2).reshape({b, t, w});
  at::Tensor h = x + proj_->forward(attn);
  return h + fc2_->forward(at::gelu(fc1_->forward(norm2_->forward(h))));
}

}  // namespace conveyor
