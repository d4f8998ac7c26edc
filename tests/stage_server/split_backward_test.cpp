// Zero-bubble's split backward (stage_server/split_backward.h): the input pass
// gives the input gradients, the weight pass the parameters' as one backward
// gives them, and the weight pass computes no input gradient again.
#include "stage_server/split_backward.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

namespace conveyor {
namespace {

// Two linear layers with a layer norm between, as a decoder block's MLP.
struct Net {
  at::Tensor w1 = at::randn({8, 4}).requires_grad_(), b1 = at::randn({8}).requires_grad_();
  at::Tensor g = at::randn({8}).requires_grad_(), beta = at::randn({8}).requires_grad_();
  at::Tensor w2 = at::randn({3, 8}).requires_grad_(), b2 = at::randn({3}).requires_grad_();
  at::Tensor fc1(const at::Tensor& x) const { return at::linear(x, w1, b1); }
  at::Tensor norm(const at::Tensor& x) const { return at::layer_norm(x, {8}, g, beta); }
  at::Tensor fc2(const at::Tensor& x) const { return at::linear(x, w2, b2); }
  std::vector<at::Tensor> params() const { return {w1, b1, g, beta, w2, b2}; }
  void zero() {
    for (auto& p : params()) p.mutable_grad() = at::Tensor();
  }
};

// x -> fc1 -> layer norm -> relu (hooked: each time its input gradient is
// computed) -> fc2 -> squared sum; `twice`: fc1 again on its own output's
// first 4 columns (a weight shared within the chunk).
at::Tensor Loss(Net& n, const at::Tensor& x, int* relu_grads, bool twice = false) {
  at::Tensor h = n.fc1(x);
  if (twice) h = n.fc1(h.narrow(1, 0, 4));
  at::Tensor r = at::relu(n.norm(h));
  r.register_hook([relu_grads](const at::Tensor& g) {
    ++*relu_grads;
    return g;
  });
  return n.fc2(r).pow(2).sum();
}

void ExpectSplitEqualsOneBackward(bool twice, bool want_split) {
  at::manual_seed(0);
  Net n;
  const at::Tensor x0 = at::randn({5, 4});
  int calls = 0;
  at::Tensor x = x0.clone().requires_grad_();
  Loss(n, x, &calls, twice).backward();
  std::vector<at::Tensor> want;
  for (auto& p : n.params()) want.push_back(p.grad().clone());
  const at::Tensor want_x = x.grad().clone();
  n.zero();

  calls = 0;
  at::Tensor y = x0.clone().requires_grad_();
  at::Tensor loss = Loss(n, y, &calls, twice);
  std::shared_ptr<SplitBackward> weights;
  std::vector<at::Tensor> got_x = SplitBackward::InputPass({loss}, {}, {y}, n.params(), &weights);
  ASSERT_EQ(got_x.size(), 1u);
  EXPECT_TRUE(at::allclose(got_x[0], want_x)) << got_x[0] << want_x;
  for (auto& p : n.params()) EXPECT_FALSE(p.grad().defined()) << "the input pass left the parameters alone";
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(weights->split(), want_split);
  if (want_split) EXPECT_GT(weights->kept_bytes(), 0);
  weights->WeightPass();
  // Split: the relu's input gradient is not computed again (the old weight
  // pass ran backward from the loss once more).
  EXPECT_EQ(calls, want_split ? 1 : 2);
  const auto params = n.params();
  for (std::size_t i = 0; i < params.size(); ++i) {
    ASSERT_TRUE(params[i].grad().defined()) << "parameter " << i;
    EXPECT_TRUE(at::allclose(params[i].grad(), want[i])) << "parameter " << i;
  }
}

TEST(SplitBackward, TheWeightPassGivesOneBackwardsGradientsAndComputesNoInputGradientAgain) {
  ExpectSplitEqualsOneBackward(/*twice=*/false, /*want_split=*/true);
}

TEST(SplitBackward, AWeightSharedWithinTheChunkFallsBackToABackwardFromTheOutputs) {
  ExpectSplitEqualsOneBackward(/*twice=*/true, /*want_split=*/false);
}

// A first chunk has no input gradient to send: the weight pass is the whole backward.
TEST(SplitBackward, WithoutInputsTheWeightPassIsTheWholeBackward) {
  at::manual_seed(0);
  Net n;
  const at::Tensor x = at::randn({5, 4});
  int calls = 0;
  Loss(n, x, &calls).backward();
  std::vector<at::Tensor> want;
  for (auto& p : n.params()) want.push_back(p.grad().clone());
  n.zero();
  calls = 0;
  at::Tensor loss = Loss(n, x, &calls);
  std::shared_ptr<SplitBackward> weights;
  EXPECT_TRUE(SplitBackward::InputPass({loss}, {}, {}, n.params(), &weights).empty());
  EXPECT_EQ(calls, 0);
  weights->WeightPass();
  EXPECT_EQ(calls, 1);
  const auto params = n.params();
  for (std::size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(at::allclose(params[i].grad(), want[i])) << i;
}

}  // namespace
}  // namespace conveyor
