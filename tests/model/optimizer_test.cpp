// model/optimizer.h: parameter groups by name, gradient norms and scaling.
// Each optimizer's steps against torch.optim: tests/model/oracle_test.cpp.
#include "model/optimizer.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <torch/serialize.h>

#include <cmath>
#include <sstream>

namespace conveyor {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

v1::OptimizerSpec AdamW(std::vector<std::string> no_decay) {
  v1::OptimizerSpec o;
  o.set_kind(v1::OPTIMIZER_ADAMW);
  o.set_lr(1e-3);
  o.set_beta1(0.9);
  o.set_beta2(0.95);
  o.set_eps(1e-8);
  o.set_weight_decay(0.1);
  for (auto& p : no_decay) o.add_no_decay(p);
  return o;
}

// Saves `from`'s state as a checkpoint does and loads it into `to`, whose
// parameters take `from`'s values.
void LoadInto(torch::optim::Optimizer& from, const NamedTensors& from_params, torch::optim::Optimizer& to,
              NamedTensors* to_params) {
  torch::serialize::OutputArchive out;
  from.save(out);
  std::ostringstream bytes;
  out.save_to(bytes);
  torch::serialize::InputArchive in;
  std::istringstream read(bytes.str());
  in.load_from(read);
  for (std::size_t i = 0; i < from_params.size(); ++i)
    (*to_params)[i].second.detach().copy_(from_params[i].second.detach());
  to.load(in);
}

TEST(Optimizer, NoDecayMatchesWholeComponents) {
  const v1::OptimizerSpec o = AdamW({"bias", "norm"});
  EXPECT_TRUE(MatchesNoDecay(o, "3.l.bias"));
  EXPECT_TRUE(MatchesNoDecay(o, "2.norm.weight"));
  EXPECT_TRUE(MatchesNoDecay(o, "bias"));
  EXPECT_FALSE(MatchesNoDecay(o, "3.biases"));
  EXPECT_FALSE(MatchesNoDecay(o, "2.layernorm.weight"));
  EXPECT_FALSE(MatchesNoDecay(o, "1.weight"));
  EXPECT_FALSE(MatchesNoDecay(AdamW({}), "1.bias"));
}

TEST(Optimizer, GroupsSplitByNameAndOnlyTheFirstDecays) {
  NamedTensors params = {{"0.weight", at::ones({2, 2})},
                         {"0.bias", at::ones({2})},
                         {"1.norm.weight", at::ones({2})},
                         {"2.weight", at::ones({2, 2})}};
  for (auto& [name, t] : params) t.requires_grad_(true);
  ParameterGroups groups;
  auto opt = MakeOptimizer(AdamW({"bias", "norm"}), params, &groups);
  EXPECT_THAT(groups.decay, ElementsAre("0.weight", "2.weight"));
  EXPECT_THAT(groups.no_decay, ElementsAre("0.bias", "1.norm.weight"));
  EXPECT_THAT(groups.Describe(0.1), HasSubstr("no decay: 2 tensors [0.bias, 1.norm.weight]"));
  ASSERT_EQ(opt->param_groups().size(), 2u);
  // Zero gradients: AdamW's only change is its decoupled decay, lr * wd * p.
  for (auto& [name, t] : params) t.mutable_grad() = at::zeros_like(t);
  SetLearningRate(*opt, 0.5);
  opt->step();
  EXPECT_NEAR(params[0].second[0][0].item<double>(), 1 - 0.5 * 0.1, 1e-7);
  EXPECT_DOUBLE_EQ(params[1].second[0].item<double>(), 1.0);  // no decay
  EXPECT_DOUBLE_EQ(params[2].second[0].item<double>(), 1.0);
  // Without patterns: one group.
  EXPECT_EQ(MakeOptimizer(AdamW({}), params)->param_groups().size(), 1u);
}

TEST(Optimizer, GradNormAndScaling) {
  std::vector<at::Tensor> params = {at::zeros({2}), at::zeros({1}), at::zeros({3})};
  params[0].mutable_grad() = at::tensor({3.0f, 4.0f});
  params[1].mutable_grad() = at::tensor({12.0f});
  // params[2] has no gradient: it counts nothing.
  EXPECT_DOUBLE_EQ(GradSquaredNorm(params), 9 + 16 + 144);
  ScaleGrads(params, 0.5);
  EXPECT_DOUBLE_EQ(params[0].grad()[1].item<double>(), 2.0);
  EXPECT_DOUBLE_EQ(GradSquaredNorm(params), (9 + 16 + 144) / 4.0);
  params[1].mutable_grad() = at::tensor({std::nanf("")});
  EXPECT_TRUE(std::isnan(GradSquaredNorm(params)));
}

// optimizer.foreach (the default for sgd): the multi-tensor step holds the
// same state as LibTorch's loop (checkpoints load either way) and takes the
// same steps: momentum from its first step on, Nesterov, weight decay in one
// group and not the other, a parameter without a gradient left alone.
TEST(Optimizer, ForeachSgdTakesLibTorchsStepsWithItsState) {
  for (bool nesterov : {false, true}) {
    v1::OptimizerSpec o;
    o.set_kind(v1::OPTIMIZER_SGD);
    o.set_lr(0.1);
    o.set_momentum(0.9);
    o.set_nesterov(nesterov);
    o.set_weight_decay(0.01);
    o.add_no_decay("bias");
    auto make = [&](bool per_tensor, NamedTensors* named) {
      at::manual_seed(3);
      *named = {{"l.weight", at::randn({4, 3}).requires_grad_()}, {"l.bias", at::randn({4}).requires_grad_()},
                {"frozen", at::randn({2}).requires_grad_()}};
      v1::OptimizerSpec spec = o;
      spec.set_per_tensor(per_tensor);
      return MakeOptimizer(spec, *named);
    };
    NamedTensors loop_params, foreach_params;
    auto loop = make(true, &loop_params);
    auto foreach = make(false, &foreach_params);
    for (int step = 0; step < 4; ++step) {
      for (NamedTensors* named : {&loop_params, &foreach_params}) {
        for (int i = 0; i < 2; ++i) (*named)[i].second.mutable_grad() = at::full_like((*named)[i].second, 0.5 * (step + 1) - i);
      }
      loop->step();
      foreach->step();
      for (int i = 0; i < 3; ++i)
        ASSERT_TRUE(at::equal(loop_params[i].second, foreach_params[i].second)) << "nesterov " << nesterov << " step "
                                                                               << step << " " << loop_params[i].first;
    }
    EXPECT_EQ(OptimizerStateBytes(*foreach), OptimizerStateBytes(*loop));
    EXPECT_EQ(OptimizerStateBytes(*foreach), (12 + 4) * 4) << "a momentum buffer for each parameter with gradients";
    // Its state serialises as LibTorch's SGD's: the loop loads it and goes on alike.
    NamedTensors copy_params;
    auto copy = make(true, &copy_params);
    LoadInto(*foreach, foreach_params, *copy, &copy_params);
    for (NamedTensors* named : {&copy_params, &foreach_params})
      for (int i = 0; i < 2; ++i) (*named)[i].second.mutable_grad() = at::full_like((*named)[i].second, 0.25);
    copy->step();
    foreach->step();
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(at::equal(copy_params[i].second, foreach_params[i].second)) << i;
  }
}

// The same for adam and adamw (optimizer.foreach, their default too): on the
// CPU the very values of LibTorch's loop, step by step, with weight decay in
// one group only, a parameter that has a gradient only from its third step
// (so its step count lags the others') and one that never has one; the state
// serialises as the loop's, which loads it and goes on alike.
TEST(Optimizer, ForeachAdamTakesLibTorchsStepsWithItsState) {
  for (v1::OptimizerKind kind : {v1::OPTIMIZER_ADAM, v1::OPTIMIZER_ADAMW}) {
    v1::OptimizerSpec o = AdamW({"bias"});
    o.set_kind(kind);
    o.set_lr(0.05);
    auto make = [&](bool per_tensor, NamedTensors* named) {
      at::manual_seed(5);
      *named = {{"l.weight", at::randn({4, 3}).requires_grad_()},
                {"l.bias", at::randn({4}).requires_grad_()},
                {"late.weight", at::randn({3}).requires_grad_()},
                {"frozen", at::randn({2}).requires_grad_()}};
      v1::OptimizerSpec spec = o;
      spec.set_per_tensor(per_tensor);
      return MakeOptimizer(spec, *named);
    };
    auto grads = [](NamedTensors* named, int step) {
      at::manual_seed(100 + step);
      for (int i = 0; i < 3; ++i) {
        at::Tensor g = at::randn_like((*named)[i].second);
        if (i < 2 || step >= 2) (*named)[i].second.mutable_grad() = g;
      }
    };
    const std::string what = kind == v1::OPTIMIZER_ADAM ? "adam" : "adamw";
    NamedTensors loop_params, foreach_params;
    auto loop = make(true, &loop_params);
    auto foreach = make(false, &foreach_params);
    const at::Tensor late_start = foreach_params[2].second.detach().clone();
    const at::Tensor frozen_start = foreach_params[3].second.detach().clone();
    for (int step = 0; step < 5; ++step) {
      grads(&loop_params, step);
      grads(&foreach_params, step);
      loop->step();
      foreach->step();
      for (int i = 0; i < 4; ++i)
        ASSERT_TRUE(at::equal(loop_params[i].second, foreach_params[i].second))
            << what << " step " << step << " " << loop_params[i].first;
    }
    EXPECT_FALSE(at::equal(foreach_params[2].second, late_start)) << "the late parameter moved";
    EXPECT_TRUE(at::equal(foreach_params[3].second, frozen_start)) << "the frozen one did not";
    EXPECT_EQ(OptimizerStateBytes(*foreach), (12 + 4 + 3) * 4 * 2) << what << ": two moments per trained tensor";
    NamedTensors copy_params;
    auto copy = make(true, &copy_params);
    LoadInto(*foreach, foreach_params, *copy, &copy_params);
    grads(&copy_params, 5);
    grads(&foreach_params, 5);
    copy->step();
    foreach->step();
    for (int i = 0; i < 4; ++i) EXPECT_TRUE(at::equal(copy_params[i].second, foreach_params[i].second)) << what << i;
  }
}

}  // namespace
}  // namespace conveyor
