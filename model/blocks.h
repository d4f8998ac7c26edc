// Layers of the zoo that are more than one LibTorch module: torchvision's
// ResNet bottleneck, and a GPT decoder's embedding and pre-norm block.
#pragma once

#include <torch/nn/cloneable.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/normalization.h>

namespace conveyor {

// A linear layer: torch::nn::Linear's parameters and names ("weight" [out,
// in], "bias" [out]), computed by ATen's linear. The C++ frontend's own
// Linear::forward multiplies a 3-D input and then adds the bias in a kernel
// of its own; at::linear (what PyTorch's Python nn.Linear calls) folds the
// bias into the GEMM's epilogue. On W2 the separate adds took 8% of a step.
// Its parameters start as zeros: the zoo draws them (InitLayer, from the
// layer's own generator) or a checkpoint fills them. nn::Linear drew them
// once more through the global generator only to be overwritten, a pass over
// 95% of W2's 1.34 B weights, one thread, at every start.
class DenseImpl : public torch::nn::Cloneable<DenseImpl> {
 public:
  DenseImpl(int64_t in_features, int64_t out_features) : in_(in_features), out_(out_features) { reset(); }
  void reset() override;
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight, bias;

 private:
  int64_t in_, out_;
};
TORCH_MODULE(Dense);

// torchvision's Bottleneck: 1x1, 3x3 (stride), 1x1 (4x planes) convolutions
// with BatchNorm, and a projected shortcut where the shape changes.
class BottleneckImpl : public torch::nn::Module {
 public:
  BottleneckImpl(int64_t in_planes, int64_t planes, int64_t stride);
  at::Tensor forward(const at::Tensor& x);

 private:
  torch::nn::Conv2d conv1_{nullptr}, conv2_{nullptr}, conv3_{nullptr};
  torch::nn::BatchNorm2d bn1_{nullptr}, bn2_{nullptr}, bn3_{nullptr};
  torch::nn::Sequential downsample_{nullptr};
};
TORCH_MODULE(Bottleneck);

// Token plus learned position embeddings: int64 [B, T] -> [B, T, width].
class TokenEmbeddingImpl : public torch::nn::Module {
 public:
  TokenEmbeddingImpl(int64_t vocab, int64_t width, int64_t max_tokens);
  at::Tensor forward(const at::Tensor& tokens);

 private:
  torch::nn::Embedding tokens_{nullptr}, positions_{nullptr};
};
TORCH_MODULE(TokenEmbedding);

// x + attention(norm(x)), then x + mlp(norm(x)): causal, GELU, no dropout.
// fused_qkv: attention's q, k, v are views of the qkv projection whose
// backward writes their gradients once, in the projection's layout
// (SplitHeads); otherwise unbind's backward stacks them and a reshape copies
// the stack (model/split_heads.h). The same values either way.
class DecoderBlockImpl : public torch::nn::Module {
 public:
  DecoderBlockImpl(int64_t width, int64_t heads, int64_t mlp_width, bool fused_qkv = true);
  at::Tensor forward(const at::Tensor& x);

 private:
  int64_t heads_;
  bool fused_qkv_;
  torch::nn::LayerNorm norm1_{nullptr}, norm2_{nullptr};
  Dense qkv_{nullptr}, proj_{nullptr}, fc1_{nullptr}, fc2_{nullptr};
};
TORCH_MODULE(DecoderBlock);

}  // namespace conveyor
