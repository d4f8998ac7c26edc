// FlatViews (stage_server/flat_views.h): tensors rebound as views of one flat
// tensor per dtype keep their values, strides and identity, so that a
// collective on the flats reaches them with no copy.
#include "stage_server/flat_views.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

namespace conveyor {
namespace {

TEST(FlatViews, TensorsBecomeViewsOfOneFlatPerDtypeHoldingTheirValuesAndStrides) {
  at::NoGradGuard no_grad;
  at::Tensor w = at::randn({3, 4}).requires_grad_();  // a parameter
  at::Tensor conv = at::randn({2, 3, 2, 2}).contiguous(at::MemoryFormat::ChannelsLast).requires_grad_();
  at::Tensor half = at::randn({5}).to(at::kBFloat16);
  at::Tensor strided = at::randn({4, 6}).t();  // dense, transposed strides
  at::Tensor gappy = at::randn({4, 6}).narrow(1, 0, 3);  // not dense: becomes contiguous
  const std::vector<at::Tensor> tensors{w, conv, half, strided, gappy};
  std::vector<at::Tensor> before;
  for (const at::Tensor& t : tensors) before.push_back(t.clone());
  const at::Tensor handle = w;  // another handle to w's TensorImpl (as a module's slot is)

  FlatViews flat = FlatViews::Make(tensors);
  ASSERT_EQ(flat.flats().size(), 2u);  // float, bfloat16
  EXPECT_EQ(flat.flats()[0].numel(), 12 + 24 + 24 + 12);
  EXPECT_EQ(flat.flats()[1].numel(), 5);
  for (std::size_t i = 0; i < tensors.size(); ++i) EXPECT_TRUE(tensors[i].equal(before[i])) << i;
  EXPECT_TRUE(conv.is_contiguous(at::MemoryFormat::ChannelsLast));
  EXPECT_EQ(strided.strides(), before[3].strides());
  EXPECT_TRUE(gappy.is_contiguous());
  EXPECT_TRUE(w.requires_grad());
  EXPECT_TRUE(flat.Holds(tensors));

  // Writing the flats writes every tensor, through any handle.
  flat.flats()[0].fill_(2.0);
  flat.flats()[1].fill_(3.0);
  EXPECT_TRUE(handle.eq(2.0).all().item<bool>());
  EXPECT_TRUE(conv.eq(2.0).all().item<bool>());
  EXPECT_TRUE(gappy.eq(2.0).all().item<bool>());
  EXPECT_TRUE(half.eq(3.0).all().item<bool>());

  // A tensor moved elsewhere since, or another list, is no longer held.
  gappy.set_(at::zeros({4, 3}));
  EXPECT_FALSE(flat.Holds(tensors));
  EXPECT_FALSE(flat.Holds({w, conv}));
}

TEST(FlatViews, GradientsStillFlowToReboundParameters) {
  at::Tensor w = at::randn({3, 4}).requires_grad_();
  {
    at::NoGradGuard no_grad;
    FlatViews::Make({w});
  }
  at::Tensor x = at::randn({2, 4});
  at::linear(x, w).sum().backward();
  ASSERT_TRUE(w.grad().defined());
  EXPECT_TRUE(w.grad().allclose(x.sum(0).expand({3, 4})));
}

}  // namespace
}  // namespace conveyor
