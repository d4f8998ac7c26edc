// Issue 18's job keys (optimizer groups, lr_schedule, clip_grad_norm) and the
// schedule's formula, torch-free. Against PyTorch: tests/model/oracle_test.cpp.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "plan/job_spec.h"
#include "plan/lr_schedule.h"

namespace conveyor {
namespace {

using ::testing::HasSubstr;

// The issue's block, as docs/jobs.md shows it.
const char* kRecipe = R"(
model: toy
optimizer: {name: adamw, lr: 3.0e-4, betas: [0.9, 0.95], eps: 1.0e-8, weight_decay: 0.1,
            no_decay: [bias, norm]}
lr_schedule: {warmup_steps: 100, decay: cosine, min_lr: 3.0e-5}
clip_grad_norm: 1.0
steps: 1000
)";

TEST(Recipe, ParsesTheIssuesBlock) {
  auto spec = ParseJobYaml(kRecipe);
  ASSERT_TRUE(spec.ok()) << spec.status();
  const auto& o = spec->optimizer();
  EXPECT_EQ(o.kind(), v1::OPTIMIZER_ADAMW);
  EXPECT_DOUBLE_EQ(o.lr(), 3e-4);
  EXPECT_DOUBLE_EQ(o.beta2(), 0.95);
  EXPECT_DOUBLE_EQ(o.weight_decay(), 0.1);
  ASSERT_EQ(o.no_decay_size(), 2);
  EXPECT_EQ(o.no_decay(1), "norm");
  EXPECT_EQ(spec->lr_schedule().warmup_steps(), 100);
  EXPECT_EQ(spec->lr_schedule().decay(), v1::LR_DECAY_COSINE);
  EXPECT_DOUBLE_EQ(spec->lr_schedule().min_lr(), 3e-5);
  EXPECT_DOUBLE_EQ(spec->clip_grad_norm(), 1.0);
}

TEST(Recipe, DefaultsKeepTodaysJobs) {
  auto spec = ParseJobYaml("model: toy\noptimizer: {name: sgd, lr: 0.1, momentum: 0.9}\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_FALSE(spec->optimizer().nesterov());
  EXPECT_EQ(spec->optimizer().no_decay_size(), 0);
  EXPECT_EQ(spec->lr_schedule().decay(), v1::LR_DECAY_NONE);
  EXPECT_EQ(spec->clip_grad_norm(), 0);
  for (int t : {0, 5, 99}) EXPECT_DOUBLE_EQ(LearningRate(*spec, t, 100), 0.1);
  // AdamW's weight decay defaults to torch.optim.AdamW's.
  spec = ParseJobYaml("model: toy\noptimizer: adamw\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_DOUBLE_EQ(spec->optimizer().weight_decay(), 0.01);
  EXPECT_DOUBLE_EQ(spec->optimizer().lr(), 1e-3);
}

TEST(Recipe, BadKeysAreNamed) {
  const std::pair<const char*, const char*> cases[] = {
      {"optimizer: {name: adamw, no_decay: bias}", "optimizer.no_decay: expected a list of names"},
      {"optimizer: {name: adamw, no_decay: [l.bias]}", "optimizer.no_decay: item 0: expected one component"},
      {"optimizer: {name: adam, nesterov: true}", "optimizer.nesterov: only with name: sgd"},
      {"optimizer: {name: sgd, nesterov: true}", "optimizer.nesterov: needs sgd with a positive momentum"},
      {"optimizer: {name: adamw, betas: [0.9, 1.5]}", "optimizer.betas: must be at least 0 and less than 1, got 1.5"},
      {"lr_schedule: {decay: exponential}", "lr_schedule.decay: unknown value 'exponential'"},
      {"lr_schedule: {warmup: 10}", "lr_schedule.warmup: unknown key"},
      {"lr_schedule: {warmup_steps: -1}", "lr_schedule.warmup_steps: must be at least 0, got -1"},
      {"lr_schedule: {decay: cosine, min_lr: 1.0}", "lr_schedule.min_lr: must be between 0 and optimizer.lr"},
      {"lr_schedule: {decay: step}", "lr_schedule.step_size: decay: step needs step_size"},
      {"lr_schedule: {decay: step, step_size: 2, gamma: 2}", "lr_schedule.gamma: must be more than 0 and at most 1, got 2"},
      {"lr_schedule: {decay: cosine, gamma: 0.5}", "lr_schedule.gamma: only with decay: step"},
      {"lr_schedule: {decay: step, step_size: 2, min_lr: 0.001}", "lr_schedule.min_lr: only with decay: cosine or linear"},
      {"lr_schedule: 3", "lr_schedule: expected a mapping"},
      {"clip_grad_norm: -1", "clip_grad_norm: must be at least 0, got -1"},
      {"accumulate_steps: 0", "accumulate_steps: must be between 1 and 65536, got 0"},
      {"accumulate_steps: 100000", "accumulate_steps: must be between 1 and 65536, got 100000"},
      {"precision: bf16-mixed\ncuda_graphs: true", "cuda_graphs: not with mixed precision"},
      {"precision: fp16", "precision: unknown value 'fp16' (one of: fp32, bf16, bf16-mixed, fp16-mixed)"},
      {"precision: fp16-mixed\nloss_scale: {dynamic: false}", "loss_scale.dynamic: precision fp16-mixed needs"},
      {"loss_scale: {dynamic: true}\ncuda_graphs: true", "cuda_graphs: not with loss scaling"},
      {"loss_scale: {init: 8}", "loss_scale.init: only with dynamic: true or precision: fp16-mixed"},
      {"loss_scale: {dynamic: true, backoff_factor: 1}", "loss_scale.backoff_factor: must be more than 0 and less than 1"},
      {"loss_scale: {dynamic: true, growth_interval: 0}", "loss_scale.growth_interval: must be"},
      {"inject_inf_gradients: [{stage: 3, step: 1}]", "inject_inf_gradients: stage 3 is not one of the job's stages"},
      {"inject_inf_gradients: [{stage: 0}]", "inject_inf_gradients: item 0: expected {stage: S, step: N}"},
      {"clip_grad_norm: big", "clip_grad_norm: expected a number"},
  };
  for (const auto& [yaml, says] : cases) {
    auto spec = ParseJobYaml(std::string("model: toy\n") + yaml + "\n");
    ASSERT_FALSE(spec.ok()) << yaml;
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << yaml;
    EXPECT_THAT(std::string(spec.status().message()), HasSubstr(says)) << yaml;
  }
}

v1::JobSpec Schedule(const std::string& block, double lr = 1.0) {
  auto spec = ParseJobYaml("model: toy\noptimizer: {name: sgd, lr: " + std::to_string(lr) + "}\nlr_schedule: " +
                           block + "\n");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : v1::JobSpec();
}

// The issue's formula, with T = 10 steps and W = 2.
TEST(Recipe, LearningRateFollowsTheFormula) {
  const v1::JobSpec cosine = Schedule("{warmup_steps: 2, decay: cosine, min_lr: 0.1}");
  EXPECT_DOUBLE_EQ(LearningRate(cosine, 0, 10), 0.5);  // lr (t+1)/W
  EXPECT_DOUBLE_EQ(LearningRate(cosine, 1, 10), 1.0);
  EXPECT_DOUBLE_EQ(LearningRate(cosine, 2, 10), 1.0);  // p = 0
  EXPECT_DOUBLE_EQ(LearningRate(cosine, 6, 10), 0.55);  // p = 1/2: halfway to min_lr
  EXPECT_NEAR(LearningRate(cosine, 9, 10), 0.1 + 0.45 * (1 + std::cos(M_PI * 7 / 8)), 1e-15);
  EXPECT_DOUBLE_EQ(LearningRate(cosine, 10, 10), 0.1);  // p = 1 (past the end: stays there)
  const v1::JobSpec linear = Schedule("{warmup_steps: 2, decay: linear, min_lr: 0.2}");
  EXPECT_DOUBLE_EQ(LearningRate(linear, 6, 10), 0.6);
  EXPECT_DOUBLE_EQ(LearningRate(linear, 10, 10), 0.2);
  const v1::JobSpec step = Schedule("{warmup_steps: 1, decay: step, step_size: 3, gamma: 0.5}");
  EXPECT_DOUBLE_EQ(LearningRate(step, 0, 10), 1.0);
  EXPECT_DOUBLE_EQ(LearningRate(step, 3, 10), 1.0);
  EXPECT_DOUBLE_EQ(LearningRate(step, 4, 10), 0.5);
  EXPECT_DOUBLE_EQ(LearningRate(step, 9, 10), 0.25);
  const v1::JobSpec warmup_only = Schedule("{warmup_steps: 4}");
  EXPECT_DOUBLE_EQ(LearningRate(warmup_only, 0, 10), 0.25);
  EXPECT_DOUBLE_EQ(LearningRate(warmup_only, 7, 10), 1.0);
  // A warmup as long as the job: no decay to divide by zero.
  EXPECT_DOUBLE_EQ(LearningRate(cosine, 2, 2), 1.0);
}

TEST(Recipe, TheExampleParses) {
  auto spec = LoadJobFile(std::string(CONVEYOR_SOURCE_DIR) + "/examples/gpt-recipe.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->optimizer().kind(), v1::OPTIMIZER_ADAMW);
  EXPECT_GT(spec->clip_grad_norm(), 0);
  EXPECT_EQ(spec->lr_schedule().decay(), v1::LR_DECAY_COSINE);
}

TEST(Recipe, ClipFactorIsClipGradNormsOwn) {
  EXPECT_DOUBLE_EQ(ClipFactor(1.0, 0.5), 1.0);
  EXPECT_DOUBLE_EQ(ClipFactor(1.0, 4.0), 1.0 / (4.0 + 1e-6));
  EXPECT_DOUBLE_EQ(ClipFactor(1.0, 0.0), 1.0);
}

// GradScaler's rule: back off on an overflow, grow after growth_interval
// finite steps in a row; a resumed job replays it from the steps' norms.
TEST(Recipe, LossScaleFollowsGradScalersRule) {
  auto spec = ParseJobYaml("model: toy\nprecision: fp16-mixed\nloss_scale: {init: 1024, growth_interval: 3}\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(LossScaling(*spec));  // on with fp16-mixed
  EXPECT_DOUBLE_EQ(spec->loss_scale().growth_factor(), 2);
  EXPECT_DOUBLE_EQ(spec->loss_scale().backoff_factor(), 0.5);
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<double> norms = {1, 1, inf, std::nan(""), 1, 1, 1, 1};
  LossScaleState state = InitialLossScale(*spec);
  std::vector<double> scales;
  for (double n : norms) {
    scales.push_back(state.scale);
    UpdateLossScale(*spec, !std::isfinite(n), &state);
  }
  EXPECT_EQ(scales, (std::vector<double>{1024, 1024, 1024, 512, 256, 256, 256, 512}));
  EXPECT_EQ(state.growth_tracker, 1);
  for (int64_t n = 0; n <= static_cast<int64_t>(norms.size()); ++n) {
    LossScaleState replayed = ReplayLossScale(*spec, norms.data(), n);
    EXPECT_DOUBLE_EQ(replayed.scale, n < static_cast<int64_t>(norms.size()) ? scales[n] : state.scale) << n;
  }
  auto plain = ParseJobYaml("model: toy\n");
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(LossScaling(*plain));
  EXPECT_DOUBLE_EQ(InitialLossScale(*plain).scale, 1);
}

}  // namespace
}  // namespace conveyor
