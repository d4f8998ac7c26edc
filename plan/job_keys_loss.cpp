// The job keys of the loss: dynamic loss scaling (and the test hook that
// overflows it) and the loss function.
#include "plan/job_key_rows.h"

#include <yaml-cpp/yaml.h>

#include <string>

namespace conveyor::job_keys_internal {
namespace {

// inject_inf_gradients: a list of {stage, step}.
Status ReadInjectInfGradients(const YAML::Node& node, S* s) {
  if (!node.IsSequence()) return Invalid("inject_inf_gradients: expected a list of {stage, step}, got " + Show(node));
  for (std::size_t i = 0; i < node.size(); ++i) {
    const YAML::Node& item = node[i];
    int64_t stage = -1, step = -1;
    const bool ok = item.IsMap() && item.size() == 2 && item["stage"] && item["step"] &&
                    ReadScalar(item["stage"], &stage) && ReadScalar(item["step"], &step) && stage >= 0 &&
                    stage < (1 << 20) && step >= 0;
    if (!ok)
      return Invalid("inject_inf_gradients: item " + std::to_string(i) +
                     ": expected {stage: S, step: N} with S and N >= 0, got " + Show(item));
    v1::InfGradient* g = s->add_inject_inf_gradients();
    g->set_stage(static_cast<int32_t>(stage));
    g->set_step(step);
  }
  return absl::OkStatus();
}

}  // namespace

// loss_scale, inject_inf_gradients and loss.
void AddLossKeys(Table& add) {
  add("loss_scale", kSection,
      "dynamic loss scaling as `torch.cuda.amp.GradScaler` does it: the loss multiplied by the scale before backward, "
      "the gradients divided by it; a step whose gradients are not finite on any stage is skipped on every stage and "
      "the scale backs off; each step's scale is in `status --json` (`loss_scales`)")
      .DefaultDoc("off; on with `fp16-mixed`");
  const auto scaling = [](const S& s) {
    return s.loss_scale().dynamic() || s.precision() == v1::PRECISION_FP16_MIXED;
  };
  add("loss_scale.dynamic", kBool, "scale the loss (always on with `precision: fp16-mixed`)")
      .DefaultDoc("`false`; `true` with `fp16-mixed`")
      .Set([](const V& v, S* s) { s->mutable_loss_scale()->set_dynamic(v.flag); });
  add("loss_scale.init", kNumber, "the first step's scale")
      .Default("65536")
      .Range(0, 1e38, /*above_lo=*/true)
      .Only("dynamic: true or precision: fp16-mixed", scaling)
      .Set([](const V& v, S* s) { s->mutable_loss_scale()->set_init(v.number); })
      .Get([](const S& s) { return s.loss_scale().init(); });
  add("loss_scale.growth_factor", kNumber, "the scale's factor after `growth_interval` finite steps in a row")
      .Default("2")
      .Range(1, 1e6, /*above_lo=*/true)
      .Only("dynamic: true or precision: fp16-mixed", scaling)
      .Set([](const V& v, S* s) { s->mutable_loss_scale()->set_growth_factor(v.number); })
      .Get([](const S& s) { return s.loss_scale().growth_factor(); });
  add("loss_scale.backoff_factor", kNumber, "the scale's factor after a step with gradients that are not finite")
      .Default("0.5")
      .Range(0, 1, /*above_lo=*/true, /*below_hi=*/true)
      .Only("dynamic: true or precision: fp16-mixed", scaling)
      .Set([](const V& v, S* s) { s->mutable_loss_scale()->set_backoff_factor(v.number); })
      .Get([](const S& s) { return s.loss_scale().backoff_factor(); });
  add("loss_scale.growth_interval", kInt, "finite steps in a row before the scale grows")
      .Default("2000")
      .Range(1, 1e12)
      .Only("dynamic: true or precision: fp16-mixed", scaling)
      .Set([](const V& v, S* s) { s->mutable_loss_scale()->set_growth_interval(v.integer); })
      .Get([](const S& s) { return static_cast<double>(s.loss_scale().growth_interval()); });
  add("inject_inf_gradients", KeyType::kCustom,
      "for tests of loss scaling: a list of `{stage: S, step: N}`; stage S puts an inf into its first gradient at "
      "optimizer step N (from 0), as an fp16 overflow would")
      .Expect("a list of {stage, step}")
      .DefaultDoc("`[]`")
      .Read(ReadInjectInfGradients);
  add("loss", kSection, "a loss name, or `{torchscript: PATH}` for your own")
      .DefaultDoc("`cross_entropy`")
      .Shorthand("name");
  add("loss.name", kChoice,
      "`cross_entropy`, `mse` (against the one-hot of class targets, or against float targets), `nll` "
      "(log-probabilities against classes) or `bce_with_logits` (logits against float targets of the output's shape)")
      .Choices(Names<v1::LossKind>({{"cross_entropy", v1::LOSS_CROSS_ENTROPY},
                                    {"mse", v1::LOSS_MSE},
                                    {"nll", v1::LOSS_NLL},
                                    {"bce_with_logits", v1::LOSS_BCE_WITH_LOGITS}}))
      .Expect("a loss name")
      .Default("cross_entropy")
      .Set([](const V& v, S* s) { s->set_loss(static_cast<v1::LossKind>(v.integer)); });
  add("loss.torchscript", kPath,
      "your own loss: a TorchScript module taking (output, target) and returning the mean over its batch "
      "(`torch.jit.script(module).save(PATH)`), run by the stage that computes the loss; not with `name`. See "
      "[models.md](models.md)")
      .Set([](const V& v, S* s) {
        s->set_loss(v1::LOSS_UNSPECIFIED);
        s->set_loss_torchscript(v.text);
      });
}

}  // namespace conveyor::job_keys_internal
