#include "model/optimizer.h"

#include <ATen/ATen.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <type_traits>

#include "model/compat.h"

namespace conveyor {

bool MatchesNoDecay(const v1::OptimizerSpec& spec, const std::string& name) {
  std::size_t begin = 0;
  while (begin <= name.size()) {
    std::size_t end = name.find('.', begin);
    if (end == std::string::npos) end = name.size();
    const std::string component = name.substr(begin, end - begin);
    for (const std::string& p : spec.no_decay())
      if (component == p) return true;
    begin = end + 1;
  }
  return false;
}

std::string ParameterGroups::Describe(double weight_decay) const {
  auto list = [](const std::vector<std::string>& names) {
    std::ostringstream out;
    out << names.size() << " tensors [";
    for (std::size_t i = 0; i < names.size(); ++i) out << (i ? ", " : "") << names[i];
    out << "]";
    return out.str();
  };
  std::ostringstream out;
  out << "decay (weight_decay " << weight_decay << "): " << list(decay) << "; no decay: " << list(no_decay);
  return out.str();
}

namespace {

template <typename Options>
std::vector<torch::optim::OptimizerParamGroup> Groups(const Options& with_decay, std::vector<at::Tensor> decay,
                                                      std::vector<at::Tensor> no_decay) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (!decay.empty()) groups.emplace_back(std::move(decay), std::make_unique<Options>(with_decay));
  if (!no_decay.empty()) {
    auto without = std::make_unique<Options>(with_decay);
    without->weight_decay(0);
    groups.emplace_back(std::move(no_decay), std::move(without));
  }
  return groups;
}

// The key of a parameter's state in torch::optim::Optimizer::state_: the
// TensorImpl's address printed (LibTorch 1.13) or the address itself (2.x).
template <typename Map>
typename Map::key_type StateKey(const Map&, const at::Tensor& p) {
  using Key = typename Map::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream out;
    out << p.unsafeGetTensorImpl();
    return out.str();
  } else {
    return static_cast<Key>(p.unsafeGetTensorImpl());
  }
}

// torch::optim::SGD's step as multi-tensor kernels (what torch.optim.SGD's
// foreach path does): per group, the weight decay, momentum and update over
// all its parameters in a few launches rather than a few per tensor. The same
// state (SGDParamState's momentum_buffer), so checkpoints and
// OptimizerStateBytes are those of torch::optim::SGD, and the same operations
// element by element.
class ForeachSgd : public torch::optim::SGD {
 public:
  using torch::optim::SGD::SGD;

  at::Tensor step(LossClosure closure = nullptr) override {
    at::NoGradGuard no_grad;
    at::Tensor loss;
    if (closure) {
      at::AutoGradMode grad(true);
      loss = closure();
    }
    for (auto& group : param_groups_) {
      const auto& o = static_cast<const torch::optim::SGDOptions&>(group.options());
      std::vector<at::Tensor> params, grads, bufs, with_buf;
      for (auto& p : group.params()) {
        if (!p.grad().defined()) continue;
        params.push_back(p);
        grads.push_back(p.grad());
      }
      if (params.empty()) continue;
      std::vector<at::Tensor> d_p =
          o.weight_decay() != 0 ? at::_foreach_add(grads, params, o.weight_decay()) : grads;
      if (o.momentum() != 0) {
        // Parameters with a buffer: buf = momentum * buf + (1 - dampening) * d_p.
        std::vector<at::Tensor> d_p_old;
        std::vector<std::size_t> old_index;
        for (std::size_t i = 0; i < params.size(); ++i) {
          const auto key = StateKey(state_, params[i]);
          auto it = state_.find(key);
          if (it == state_.end()) {
            auto st = std::make_unique<torch::optim::SGDParamState>();
            st->momentum_buffer(at::clone(d_p[i]).detach());
            bufs.push_back(st->momentum_buffer());
            state_[key] = std::move(st);
          } else {
            auto& st = static_cast<torch::optim::SGDParamState&>(*it->second);
            d_p_old.push_back(d_p[i]);
            with_buf.push_back(st.momentum_buffer());
            bufs.push_back(st.momentum_buffer());
          }
        }
        if (!with_buf.empty()) {
          at::_foreach_mul_(with_buf, o.momentum());
          at::_foreach_add_(with_buf, d_p_old, 1 - o.dampening());
        }
        d_p = o.nesterov() ? at::_foreach_add(d_p, bufs, o.momentum()) : bufs;
      }
      at::_foreach_add_(params, d_p, -o.lr());
    }
    return loss;
  }
};

// torch::optim::Adam's and AdamW's step as multi-tensor kernels (what
// torch.optim.Adam's foreach path does on CUDA by default): per group about
// ten launches over all its parameters instead of about ten per tensor. The
// same state (AdamParamState / AdamWParamState: the step count and both
// moments), so checkpoints, OptimizerStateBytes and a switch back to the loop
// carry over, and the same operations element by element: on the CPU the very
// same values; on CUDA within a rounding (LibTorch's per-tensor division by a
// scalar multiplies by its reciprocal there). AMSGrad, which no job asks for,
// takes the loop.
template <typename Base, typename Options, typename State, bool kDecoupled>
class ForeachAdam : public Base {
 public:
  using Base::Base;

  at::Tensor step(typename Base::LossClosure closure = nullptr) override {
    for (const auto& group : this->param_groups_)
      if (static_cast<const Options&>(group.options()).amsgrad()) return Base::step(std::move(closure));
    at::NoGradGuard no_grad;
    at::Tensor loss;
    if (closure) {
      at::AutoGradMode grad(true);
      loss = closure();
    }
    for (auto& group : this->param_groups_) {
      const auto& o = static_cast<const Options&>(group.options());
      const double beta1 = std::get<0>(o.betas()), beta2 = std::get<1>(o.betas());
      std::vector<at::Tensor> params, grads, avgs, sqs;
      std::vector<at::Scalar> bc2_sqrt, neg_step_size;  // per tensor: their step counts may differ
      for (auto& p : group.params()) {
        if (!p.grad().defined()) continue;
        auto& slot = this->state_[StateKey(this->state_, p)];
        if (!slot) {
          auto st = std::make_unique<State>();
          st->step(0);
          st->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
          st->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
          slot = std::move(st);
        }
        auto& st = static_cast<State&>(*slot);
        st.step(st.step() + 1);
        params.push_back(p);
        grads.push_back(p.grad());
        avgs.push_back(st.exp_avg());
        sqs.push_back(st.exp_avg_sq());
        bc2_sqrt.emplace_back(std::sqrt(1 - std::pow(beta2, st.step())));
        neg_step_size.emplace_back(-o.lr() / (1 - std::pow(beta1, st.step())));
      }
      if (params.empty()) continue;
      const double wd = o.weight_decay();
      if (kDecoupled && wd != 0) at::_foreach_mul_(params, 1 - o.lr() * wd);
      const std::vector<at::Tensor> g = !kDecoupled && wd != 0 ? at::_foreach_add(grads, params, wd) : grads;
      at::_foreach_mul_(avgs, beta1);
      at::_foreach_add_(avgs, g, 1 - beta1);
      at::_foreach_mul_(sqs, beta2);
      at::_foreach_addcmul_(sqs, g, g, 1 - beta2);
      std::vector<at::Tensor> denom = at::_foreach_sqrt(sqs);
      at::_foreach_div_(denom, bc2_sqrt);
      at::_foreach_add_(denom, o.eps());
      at::_foreach_addcdiv_(params, avgs, denom, neg_step_size);
    }
    return loss;
  }
};

template <typename Optimizer, typename Options>
std::unique_ptr<torch::optim::Optimizer> Make(const Options& o, std::vector<at::Tensor> decay,
                                              std::vector<at::Tensor> no_decay) {
  return std::make_unique<Optimizer>(Groups(o, std::move(decay), std::move(no_decay)), o);
}

}  // namespace

std::unique_ptr<torch::optim::Optimizer> MakeOptimizer(const v1::OptimizerSpec& spec, const NamedTensors& params,
                                                       ParameterGroups* groups) {
  std::vector<at::Tensor> decay, no_decay;
  ParameterGroups names;
  for (const auto& [name, t] : params) {
    const bool off = MatchesNoDecay(spec, name);
    (off ? no_decay : decay).push_back(t);
    (off ? names.no_decay : names.decay).push_back(name);
  }
  if (groups) *groups = std::move(names);
  const auto betas = std::make_tuple(spec.beta1(), spec.beta2());
  switch (spec.kind()) {
    case v1::OPTIMIZER_ADAM: {
      torch::optim::AdamOptions o(spec.lr());
      o.betas(betas).eps(spec.eps()).weight_decay(spec.weight_decay());
      if (spec.per_tensor()) return Make<torch::optim::Adam>(o, std::move(decay), std::move(no_decay));
      return Make<ForeachAdam<torch::optim::Adam, torch::optim::AdamOptions, torch::optim::AdamParamState, false>>(
          o, std::move(decay), std::move(no_decay));
    }
    case v1::OPTIMIZER_ADAMW: {
      torch::optim::AdamWOptions o(spec.lr());
      o.betas(betas).eps(spec.eps()).weight_decay(spec.weight_decay());
      if (spec.per_tensor()) return Make<torch::optim::AdamW>(o, std::move(decay), std::move(no_decay));
      return Make<ForeachAdam<torch::optim::AdamW, torch::optim::AdamWOptions, torch::optim::AdamWParamState, true>>(
          o, std::move(decay), std::move(no_decay));
    }
    default: {
      torch::optim::SGDOptions o(spec.lr());
      o.momentum(spec.momentum()).nesterov(spec.nesterov()).weight_decay(spec.weight_decay());
      if (spec.per_tensor()) return Make<torch::optim::SGD>(o, std::move(decay), std::move(no_decay));
      return Make<ForeachSgd>(o, std::move(decay), std::move(no_decay));
    }
  }
}

void SetLearningRate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

at::Tensor GradSquaredNormTensor(const std::vector<at::Tensor>& params) {
  at::Tensor sum;
  std::vector<at::Tensor> on_cuda;  // one _foreach_norm for these, in fp32
  for (const auto& p : params) {
    const at::Tensor& g = p.grad();
    if (!g.defined()) continue;
    if (g.is_cuda() && ForeachNormTakes(g.scalar_type())) {
      on_cuda.push_back(g);
      continue;
    }
    // Each tensor's norm in fp32 (as clip_grad_norm_ takes it; no double
    // copy of a large gradient), squared and summed in double on its device.
    at::Tensor n = at::linalg_vector_norm(g, 2, c10::nullopt, false, at::kFloat).to(at::kDouble);
    sum = sum.defined() ? sum + n * n : n * n;
  }
  if (!on_cuda.empty()) {
    at::Tensor norms = at::stack(ForeachNormFp32(on_cuda)).to(at::kDouble);
    at::Tensor part = norms.mul(norms).sum();
    sum = sum.defined() ? sum + part : part;
  }
  return sum;
}

double GradSquaredNorm(const std::vector<at::Tensor>& params) {
  at::Tensor sum = GradSquaredNormTensor(params);
  return sum.defined() ? sum.item<double>() : 0.0;
}

void ClipGradsOnDevice(const std::vector<at::Tensor>& params, double max_norm, const at::Tensor& sq_norm) {
  if (!sq_norm.defined()) return;
  at::Tensor factor = at::clamp_max(at::full_like(sq_norm, max_norm).div(sq_norm.sqrt() + 1e-6), 1.0);
  for (const auto& p : params) {
    at::Tensor g = p.grad();
    if (g.defined()) g.mul_(factor);
  }
}

void ScaleGrads(const std::vector<at::Tensor>& params, double factor) {
  for (const auto& p : params) {
    at::Tensor g = p.grad();
    if (g.defined()) g.mul_(factor);
  }
}

namespace {

// Adam's and AdamW's states hold the same fields.
template <typename State>
void AdamFields(const State& st, std::vector<std::pair<std::string, at::Tensor>>* out) {
  out->emplace_back("step", at::scalar_tensor(static_cast<int64_t>(st.step()), at::kLong));
  out->emplace_back("exp_avg", st.exp_avg());
  out->emplace_back("exp_avg_sq", st.exp_avg_sq());
  if (st.max_exp_avg_sq().defined()) out->emplace_back("max_exp_avg_sq", st.max_exp_avg_sq());
}

template <typename State>
StatusOr<std::unique_ptr<State>> AdamStateFrom(const at::Tensor& param, const std::map<std::string, at::Tensor>& in) {
  auto field = [&](const char* name, bool required) -> StatusOr<at::Tensor> {
    auto it = in.find(name);
    if (it == in.end()) {
      if (required) return absl::InvalidArgumentError(std::string("no ") + name + " for an Adam parameter");
      return at::Tensor();
    }
    if (it->second.sizes() != param.sizes())
      return absl::InvalidArgumentError(std::string(name) + " has another shape than its parameter");
    return it->second.to(param.device(), it->second.scalar_type()).clone();
  };
  auto st = std::make_unique<State>();
  auto step = in.find("step");
  if (step == in.end() || step->second.numel() != 1) return absl::InvalidArgumentError("no step for an Adam parameter");
  st->step(step->second.to(at::kCPU).item<int64_t>());
  CONVEYOR_ASSIGN_OR_RETURN(at::Tensor avg, field("exp_avg", true));
  CONVEYOR_ASSIGN_OR_RETURN(at::Tensor avg_sq, field("exp_avg_sq", true));
  CONVEYOR_ASSIGN_OR_RETURN(at::Tensor max_sq, field("max_exp_avg_sq", false));
  st->exp_avg(avg);
  st->exp_avg_sq(avg_sq);
  if (max_sq.defined()) st->max_exp_avg_sq(max_sq);
  return std::move(st);
}

}  // namespace

std::vector<std::pair<std::string, at::Tensor>> ParameterState(const torch::optim::Optimizer& optimizer,
                                                                const at::Tensor& param) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  const auto& states = optimizer.state();
  auto it = states.find(StateKey(states, param));
  if (it == states.end()) return out;
  const torch::optim::OptimizerParamState* s = it->second.get();
  if (const auto* sgd = dynamic_cast<const torch::optim::SGDParamState*>(s)) {
    if (sgd->momentum_buffer().defined()) out.emplace_back("momentum_buffer", sgd->momentum_buffer());
  } else if (const auto* adam = dynamic_cast<const torch::optim::AdamParamState*>(s)) {
    AdamFields(*adam, &out);
  } else if (const auto* adamw = dynamic_cast<const torch::optim::AdamWParamState*>(s)) {
    AdamFields(*adamw, &out);
  }
  return out;
}

Status SetParameterState(torch::optim::Optimizer& optimizer, const at::Tensor& param,
                         const std::map<std::string, at::Tensor>& state) {
  auto& states = optimizer.state();
  const auto key = StateKey(states, param);
  if (state.empty()) {
    states.erase(key);
    return absl::OkStatus();
  }
  if (dynamic_cast<torch::optim::Adam*>(&optimizer)) {
    CONVEYOR_ASSIGN_OR_RETURN(auto st, AdamStateFrom<torch::optim::AdamParamState>(param, state));
    states[key] = std::move(st);
  } else if (dynamic_cast<torch::optim::AdamW*>(&optimizer)) {
    CONVEYOR_ASSIGN_OR_RETURN(auto st, AdamStateFrom<torch::optim::AdamWParamState>(param, state));
    states[key] = std::move(st);
  } else {
    auto it = state.find("momentum_buffer");
    if (it == state.end()) return absl::InvalidArgumentError("no momentum_buffer for an SGD parameter");
    if (it->second.sizes() != param.sizes())
      return absl::InvalidArgumentError("momentum_buffer has another shape than its parameter");
    auto st = std::make_unique<torch::optim::SGDParamState>();
    st->momentum_buffer(it->second.to(param.device(), it->second.scalar_type()).clone());
    states[key] = std::move(st);
  }
  return absl::OkStatus();
}

int64_t OptimizerStateBytes(const torch::optim::Optimizer& optimizer) {
  auto bytes = [](const at::Tensor& t) { return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0; };
  int64_t n = 0;
  for (const auto& entry : optimizer.state()) {
    const torch::optim::OptimizerParamState* s = entry.second.get();
    if (const auto* sgd = dynamic_cast<const torch::optim::SGDParamState*>(s)) {
      n += bytes(sgd->momentum_buffer());
    } else if (const auto* adam = dynamic_cast<const torch::optim::AdamParamState*>(s)) {
      n += bytes(adam->exp_avg()) + bytes(adam->exp_avg_sq()) + bytes(adam->max_exp_avg_sq());
    } else if (const auto* adamw = dynamic_cast<const torch::optim::AdamWParamState*>(s)) {
      n += bytes(adamw->exp_avg()) + bytes(adamw->exp_avg_sq()) + bytes(adamw->max_exp_avg_sq());
    }
  }
  return n;
}

}  // namespace conveyor
