// The job keys of the optimizer and the learning rate: the optimizer and its
// settings, the lr schedule, gradient clipping and accumulation.
#include "plan/job_key_rows.h"

#include <yaml-cpp/yaml.h>

#include <string>
#include <utility>
#include <vector>

#include "plan/job_spec.h"

namespace conveyor::job_keys_internal {
namespace {

// optimizer.no_decay: the name components whose parameters get no weight decay.
Status ReadNoDecay(const YAML::Node& node, S* s) {
  if (!node.IsSequence()) return Invalid("optimizer.no_decay: expected a list of names, got " + Show(node));
  for (std::size_t i = 0; i < node.size(); ++i) {
    std::string pattern;
    if (!ReadScalar(node[i], &pattern) || pattern.empty() || pattern.find('.') != std::string::npos)
      return Invalid("optimizer.no_decay: item " + std::to_string(i) +
                     ": expected one component of a parameter name (bias, norm), got " + Show(node[i]));
    s->mutable_optimizer()->add_no_decay(pattern);
  }
  return absl::OkStatus();
}

}  // namespace

// optimizer: which one and its settings.
void AddOptimizerKeys(Table& add) {
  add("optimizer", kSection, "`{name: sgd | adam | adamw, ...}` or just the name").DefaultDoc("`sgd`").Shorthand("name");
  add("optimizer.name", kChoice,
      "`sgd`, `adam` (L2 weight decay added to the gradient) or `adamw` (decoupled weight decay), each step as "
      "`torch.optim`'s")
      .Choices(Names<v1::OptimizerKind>(
          {{"sgd", v1::OPTIMIZER_SGD}, {"adam", v1::OPTIMIZER_ADAM}, {"adamw", v1::OPTIMIZER_ADAMW}}))
      .Expect("a name")
      .Default("sgd")
      .Set([](const V& v, S* s) { s->mutable_optimizer()->set_kind(static_cast<v1::OptimizerKind>(v.integer)); });
  add("optimizer.lr", kNumber, "learning rate")
      .Default("0.01")
      .DefaultDoc("0.01 (sgd), 0.001 (adam, adamw)")
      .Positive(1e3)
      .Set([](const V& v, S* s) { s->mutable_optimizer()->set_lr(v.number); })
      .Get([](const S& s) { return s.optimizer().lr(); });
  const auto sgd = [](const S& s) { return s.optimizer().kind() == v1::OPTIMIZER_SGD; };
  const auto adam = [](const S& s) { return s.optimizer().kind() != v1::OPTIMIZER_SGD; };
  add("optimizer.momentum", kNumber, "momentum")
      .Default("0")
      .Range(0, 1)
      .Only("name: sgd", sgd)
      .Set([](const V& v, S* s) { s->mutable_optimizer()->set_momentum(v.number); })
      .Get([](const S& s) { return s.optimizer().momentum(); });
  add("optimizer.nesterov", kBool, "Nesterov momentum (with a positive `momentum`)")
      .Default("false")
      .Only("name: sgd", sgd)
      .Set([](const V& v, S* s) { s->mutable_optimizer()->set_nesterov(v.flag); });
  add("optimizer.foreach", kBool,
      "each step as a few multi-tensor (`_foreach_*`) kernels over all parameters, as `torch.optim` does on CUDA "
      "by default; false: LibTorch's loop of a few kernels per tensor. The same arithmetic either way (on CUDA "
      "adam's and adamw's within a rounding)")
      .Default("true")
      .Set([](const V& v, S* s) { s->mutable_optimizer()->set_per_tensor(!v.flag); });
  add("optimizer.weight_decay", kNumber,
      "sgd, adam: L2 penalty added to the gradient; adamw: decoupled decay (`lr * weight_decay * param`), as "
      "`torch.optim` does")
      .Default("0")
      .DefaultDoc("0; 0.01 (adamw, as torch.optim.AdamW)")
      .Range(0, 1e3)
      .Set([](const V& v, S* s) { s->mutable_optimizer()->set_weight_decay(v.number); })
      .Get([](const S& s) { return s.optimizer().weight_decay(); });
  add("optimizer.betas", KeyType::kNumberList, "the moving averages' coefficients, each in [0, 1)")
      .DefaultDoc("`[0.9, 0.999]`")
      .Length(2)
      .Range(0, 1, /*above_lo=*/false, /*below_hi=*/true)
      .Only("name: adam or adamw", adam)
      .Set([](const V& v, S* s) {
        s->mutable_optimizer()->set_beta1(v.numbers[0]);
        s->mutable_optimizer()->set_beta2(v.numbers[1]);
      });
  add("optimizer.eps", kNumber, "added to the denominator")
      .Default("1.0e-8")
      .Positive(1)
      .Only("name: adam or adamw", adam)
      .Set([](const V& v, S* s) { s->mutable_optimizer()->set_eps(v.number); })
      .Get([](const S& s) { return s.optimizer().eps(); });
  add("optimizer.no_decay", KeyType::kCustom,
      "parameter groups: a parameter whose dotted name has one of these as a whole component gets no weight decay "
      "(`bias` matches `3.l.bias`, `norm` matches `2.norm.weight`), as torchtitan and nanoGPT do; each stage logs "
      "its groups when the job starts")
      .Expect("a list of name components")
      .DefaultDoc("`[]`")
      .Read(ReadNoDecay);
}

// lr_schedule, clip_grad_norm and accumulate_steps.
void AddLrScheduleKeys(Table& add) {
  add("lr_schedule", kSection,
      "the learning rate by optimizer step t from 0, with W the warmup and T the job's optimizer steps: "
      "lr·(t+1)/W while t < W; then, with p = (t−W)/(T−W), cosine: min_lr + ½(lr−min_lr)(1 + cos πp), linear: "
      "lr − (lr−min_lr)·p, step: lr·gamma^⌊(t−W)/step_size⌋ (plan/lr_schedule.h); each step's lr is in `status "
      "--json` (`lrs`) and the progress line")
      .DefaultDoc("constant");
  const auto decays = [](std::vector<v1::LrDecay> kinds) {
    return [kinds = std::move(kinds)](const S& s) {
      for (auto k : kinds)
        if (s.lr_schedule().decay() == k) return true;
      return false;
    };
  };
  add("lr_schedule.warmup_steps", kInt, "W: optimizer steps of linear warmup from lr/W to lr")
      .Default("0")
      .Range(0)
      .Set([](const V& v, S* s) { s->mutable_lr_schedule()->set_warmup_steps(v.integer); })
      .Get([](const S& s) { return static_cast<double>(s.lr_schedule().warmup_steps()); });
  add("lr_schedule.decay", kChoice, "after the warmup: `none`, `cosine` or `linear` (to `min_lr`), or `step`")
      .Choices(Names<v1::LrDecay>({{"none", v1::LR_DECAY_NONE},
                                   {"cosine", v1::LR_DECAY_COSINE},
                                   {"linear", v1::LR_DECAY_LINEAR},
                                   {"step", v1::LR_DECAY_STEP}}))
      .Expect("none, cosine, linear or step")
      .Default("none")
      .Set([](const V& v, S* s) { s->mutable_lr_schedule()->set_decay(static_cast<v1::LrDecay>(v.integer)); });
  add("lr_schedule.min_lr", kNumber, "the floor that cosine and linear decay reach at the last step (at most lr)")
      .Default("0")
      .Range(0, 1e3)
      .Only("decay: cosine or linear", decays({v1::LR_DECAY_COSINE, v1::LR_DECAY_LINEAR}))
      .Set([](const V& v, S* s) { s->mutable_lr_schedule()->set_min_lr(v.number); })
      .Get([](const S& s) { return s.lr_schedule().min_lr(); });
  add("lr_schedule.step_size", kInt, "step decay (required with it): optimizer steps between two decays")
      .Range(1, 1e12)
      .Only("decay: step", decays({v1::LR_DECAY_STEP}))
      .Set([](const V& v, S* s) { s->mutable_lr_schedule()->set_step_size(v.integer); });
  add("lr_schedule.gamma", kNumber, "step decay: the factor of each decay")
      .Default("0.1")
      .Range(0, 1, /*above_lo=*/true)
      .Only("decay: step", decays({v1::LR_DECAY_STEP}))
      .Set([](const V& v, S* s) { s->mutable_lr_schedule()->set_gamma(v.number); });
  add("clip_grad_norm", kNumber,
      "the gradients of all stages scaled so that their global L2 norm is at most this, as "
      "`torch.nn.utils.clip_grad_norm_` on the whole model: each stage reports its share of the squared norm, the "
      "coordinator sends every stage the one factor (see [Training recipes](#training-recipes)); each step's norm is "
      "in `status --json` (`grad_norms`); 0: no clipping")
      .Default("0")
      .Range(0, 1e300)
      .Set([](const V& v, S* s) { s->set_clip_grad_norm(v.number); })
      .Get([](const S& s) { return s.clip_grad_norm(); });
  add("accumulate_steps", kInt,
      "K: one optimizer step per K batches, their gradients summed with each batch's loss weighted 1/K (a step "
      "reads K x batch_size samples; `steps` counts optimizer steps)")
      .Default("1")
      .Range(1, 65536)
      .Set([](const V& v, S* s) { s->set_accumulate_steps(static_cast<int32_t>(v.integer)); })
      .Get([](const S& s) { return AccumulateSteps(s); });  // 0 in an older spec: 1
}

}  // namespace conveyor::job_keys_internal
