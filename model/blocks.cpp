#include "model/blocks.h"

#include <ATen/ATen.h>

#include "model/compat.h"

namespace conveyor {

namespace nn = torch::nn;

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

DecoderBlockImpl::DecoderBlockImpl(int64_t width, int64_t heads, int64_t mlp_width) : heads_(heads) {
  norm1_ = register_module("norm1", nn::LayerNorm(nn::LayerNormOptions({width})));
  qkv_ = register_module("qkv", Dense(width, 3 * width));
  proj_ = register_module("proj", Dense(width, width));
  norm2_ = register_module("norm2", nn::LayerNorm(nn::LayerNormOptions({width})));
  fc1_ = register_module("fc1", Dense(width, mlp_width));
  fc2_ = register_module("fc2", Dense(mlp_width, width));
}

at::Tensor DecoderBlockImpl::forward(const at::Tensor& x) {
  const int64_t b = x.size(0), t = x.size(1), w = x.size(2);
  // [B, T, 3W] -> 3 x [B, heads, T, W / heads]
  // unbind, not three selects: its backward writes the gradient once
  // instead of zero-filling and summing three full-size copies.
  std::vector<at::Tensor> qkv =
      qkv_->forward(norm1_->forward(x)).view({b, t, 3, heads_, w / heads_}).permute({2, 0, 3, 1, 4}).unbind(0);
  at::Tensor attn = CausalAttention(qkv[0], qkv[1], qkv[2]).transpose(1, 2).reshape({b, t, w});
  at::Tensor h = x + proj_->forward(attn);
  return h + fc2_->forward(at::gelu(fc1_->forward(norm2_->forward(h))));
}

}  // namespace conveyor
