// The partition's runtime (model/exported/program.h): layers [begin, end) of
// a program run node by node through LibTorch's operator dispatcher, each
// call's arguments taken from its plan (argument_plans.cpp), so that
// autograd records them as it records any eager call.
#include <ATen/ScalarOps.h>
#include <ATen/core/grad_mode.h>
#include <ATen/core/stack.h>

#include <mutex>

#include "model/exported/program.h"
#include "model/out_of_memory.h"
#include "model/split_heads.h"

namespace conveyor::exported {
namespace {

class ExportedPartition final : public Partition {
 public:
  // `held`: the state of layers [begin, end), read from the archive;
  // `copies`: the buffers that the nodes replayed at `begin` read (held by an
  // earlier stage, copied here, not this partition's state).
  // `fuse`: attention's head splits run as one (FoldHeadSplits).
  ExportedPartition(std::shared_ptr<const Program> program, int begin, int end, std::map<std::string, at::Tensor> held,
                    std::map<std::string, at::Tensor> copies, bool fuse)
      : program_(std::move(program)), begin_(begin), end_(end), fuse_(fuse) {
    for (auto& [name, t] : copies) {
      held.emplace(name, t);
      copies_.emplace_back(name, t);
    }
    for (int k = begin; k < end; ++k) {
      layers_.push_back({k, ""});
      NamedTensors params, buffers;
      for (const std::string& name : program_->layer_state[static_cast<std::size_t>(k)]) {
        at::Tensor t = held.at(name);
        if (program_->parameters.count(name)) {
          t.set_requires_grad(true);
          params.emplace_back(name, t);
        } else {
          buffers.emplace_back(name, t);
        }
      }
      params_.push_back(std::move(params));
      buffers_.push_back(std::move(buffers));
    }
    // The placeholders of the state held, with the tensors (shared: To()
    // changes their data in place).
    for (const auto& [slot, name] : program_->state_slots) {
      auto it = held.find(name);
      if (it != held.end()) held_slots_.emplace_back(slot, it->second);
    }
  }

  StatusOr<Tensors> Forward(const Tensors& inputs) override {
    const Program& p = *program_;
    const std::vector<int>& in_slots = p.crossing_slots[static_cast<std::size_t>(begin_)];
    if (inputs.size() != in_slots.size()) {
      return absl::InvalidArgumentError("layer " + std::to_string(begin_) + " of " + p.path + " takes " +
                                        std::to_string(in_slots.size()) + " tensor(s), got " +
                                        std::to_string(inputs.size()));
    }
    // Dynamic shapes: the sizes of this forward's tensors give the symbols' values.
    std::map<std::string, int64_t> symbols;
    for (const SymBinding& b : p.bindings[static_cast<std::size_t>(begin_)]) {
      const at::Tensor& t = inputs[b.input];
      if (b.dim >= t.dim()) {
        return Bad(p, "tensor " + std::to_string(b.input) + " entering layer " + std::to_string(begin_) + " has " +
                          std::to_string(t.dim()) + " dimensions; the program reads size " + b.symbol +
                          " from its dimension " + std::to_string(b.dim));
      }
      symbols.emplace(b.symbol, t.size(b.dim));
    }
    std::vector<at::Tensor> values(p.slot_of.size());
    for (std::size_t i = 0; i < inputs.size(); ++i) values[static_cast<std::size_t>(in_slots[i])] = inputs[i];
    for (const auto& [slot, t] : held_slots_) values[static_cast<std::size_t>(slot)] = t;
    // What entered the earlier stage's layers without depending on the batch, made again.
    for (std::size_t i : p.replay[static_cast<std::size_t>(begin_)])
      CONVEYOR_RETURN_IF_ERROR(Run(p.nodes[i], values, symbols));
    // Seeded per layer (training), as other partitions are: nothing else may
    // draw from the process's generators until the layers held are done.
    const bool seeded = random_key_.has_value() && training_;
    std::unique_lock<std::mutex> lock(DefaultGeneratorMutex(), std::defer_lock);
    if (seeded) lock.lock();
    for (int k = begin_; k < end_; ++k) {
      if (seeded) at::manual_seed(DropoutSeed(random_key_->seed, random_key_->step, random_key_->micro_batch, k));
      const std::size_t layer = static_cast<std::size_t>(k);
      const std::size_t last = layer + 1 < p.starts.size() ? p.starts[layer + 1] : p.nodes.size();
      for (std::size_t i = p.starts[layer]; i < last; ++i) CONVEYOR_RETURN_IF_ERROR(Run(p.nodes[i], values, symbols));
    }
    const bool at_end = static_cast<std::size_t>(end_) == p.starts.size();
    Tensors out;
    for (int slot : at_end ? p.user_output_slots : p.crossing_slots[static_cast<std::size_t>(end_)]) {
      const at::Tensor& t = values[static_cast<std::size_t>(slot)];
      if (!t.defined()) return Bad(p, "a value that crosses a cut was not computed");
      out.push_back(t);
    }
    return out;
  }

  NamedTensors LayerParameters(int i) const override { return params_[static_cast<std::size_t>(i)]; }
  NamedTensors LayerBuffers(int i) const override { return buffers_[static_cast<std::size_t>(i)]; }

  void To(const c10::Device& device, c10::ScalarType dtype) override {
    at::NoGradGuard no_grad;
    device_ = device;
    std::vector<NamedTensors*> all = {&copies_};
    for (auto* group : {&params_, &buffers_})
      for (NamedTensors& layer : *group) all.push_back(&layer);
    for (NamedTensors* tensors : all) {
      for (auto& [name, t] : *tensors) {
        const bool convert = dtype != c10::ScalarType::Undefined && at::isFloatingType(t.scalar_type());
        t.set_data(convert ? t.data().to(device, dtype) : t.data().to(device));
      }
    }
  }
  void Train(bool on) override { training_ = on; }
  bool is_training() const override { return training_; }

 private:
  Status Run(const Node& node, std::vector<at::Tensor>& values, const std::map<std::string, int64_t>& symbols) {
    if (fuse_ && node.folded) return absl::OkStatus();  // its head split runs it
    if (fuse_ && node.split) return RunHeadSplit(node, values, symbols);
    return Call(node, values, symbols);
  }

  // The view, permute and unbind of a head split as one SplitHeads where the
  // projection has the shape the view gives it; as the three nodes otherwise
  // (their own errors then).
  Status RunHeadSplit(const Node& unbind, std::vector<at::Tensor>& values,
                      const std::map<std::string, int64_t>& symbols) {
    const Node::HeadSplit& split = *unbind.split;
    const Node& view = program_->nodes[split.view];
    const at::Tensor& x = values[static_cast<std::size_t>(split.input)];
    const int64_t h = split.heads;
    if (x.defined() && x.dim() == 3 && x.size(2) % (3 * h) == 0 &&
        IntsOf(view.args[1], symbols) == std::vector<int64_t>{x.size(0), x.size(1), 3, h, x.size(2) / (3 * h)}) {
      try {
        std::vector<at::Tensor> qkv = SplitHeads(x, h);
        for (std::size_t j = 0; j < 3; ++j) values[static_cast<std::size_t>(unbind.outs[0][j])] = std::move(qkv[j]);
        return absl::OkStatus();
      } catch (const std::exception& e) {
        if (IsOutOfMemory(e)) throw;
        return absl::InvalidArgumentError("model.exported: node '" + unbind.name + "' (the heads split of '" +
                                          view.name + "') failed: " + WithoutBacktrace(e).substr(0, 600));
      }
    }
    CONVEYOR_RETURN_IF_ERROR(Call(view, values, symbols));
    CONVEYOR_RETURN_IF_ERROR(Call(program_->nodes[split.permute], values, symbols));
    return Call(unbind, values, symbols);
  }

  // Argument `a` of `node` onto the call's stack: a constant, the mode, the
  // device, tensors from their slots, sizes evaluated on this forward's symbols.
  Status PushArg(const Node& node, const ArgPlan& a, const std::vector<at::Tensor>& values,
                 const std::map<std::string, int64_t>& symbols, torch::jit::Stack& stack) const {
    switch (a.kind) {
      case ArgPlan::kConstant: stack.push_back(a.constant); break;
      case ArgPlan::kTrainingFlag: stack.emplace_back(training_); break;
      case ArgPlan::kDevice: stack.emplace_back(device_); break;
      case ArgPlan::kTensor: stack.emplace_back(values[static_cast<std::size_t>(a.slots[0])]); break;
      case ArgPlan::kSymInt:
      case ArgPlan::kSymInts: {
        std::vector<int64_t> sizes;
        for (const SymExpr& e : a.sizes) {
          auto v = e.Eval(symbols);
          if (!v.ok()) {
            return absl::InvalidArgumentError("model.exported: node '" + node.name + "' (" + node.target +
                                              "): " + std::string(v.status().message()));
          }
          sizes.push_back(*v);
        }
        if (a.kind == ArgPlan::kSymInts) {
          stack.emplace_back(std::move(sizes));
        } else if (a.as_tensor) {  // a number where the operator takes a tensor, as PlanArg's constants
          at::Tensor t = at::scalar_to_tensor(c10::Scalar(sizes[0]));
          t.unsafeGetTensorImpl()->set_wrapped_number(true);
          stack.emplace_back(std::move(t));
        } else {
          stack.emplace_back(sizes[0]);
        }
        break;
      }
      case ArgPlan::kTensorList: {
        c10::List<at::Tensor> list;
        for (int s : a.slots) list.push_back(values[static_cast<std::size_t>(s)]);
        stack.emplace_back(std::move(list));
        break;
      }
      case ArgPlan::kOptionalTensorList: {
        c10::List<c10::optional<at::Tensor>> list;
        for (int s : a.slots) {
          if (s < 0) {
            list.push_back(c10::nullopt);
          } else {
            list.push_back(values[static_cast<std::size_t>(s)]);
          }
        }
        stack.emplace_back(std::move(list));
        break;
      }
    }
    return absl::OkStatus();
  }

  // One node through the operator dispatcher.
  Status Call(const Node& node, std::vector<at::Tensor>& values, const std::map<std::string, int64_t>& symbols) {
    if (!training_ && node.counts_batches >= 0) {  // evaluation does not count batches
      for (const std::vector<int>& o : node.outs)
        if (o.size() == 1) values[static_cast<std::size_t>(o[0])] = values[static_cast<std::size_t>(node.counts_batches)];
      return absl::OkStatus();
    }
    torch::jit::Stack stack;
    stack.reserve(node.args.size());
    for (const ArgPlan& a : node.args) CONVEYOR_RETURN_IF_ERROR(PushArg(node, a, values, symbols, stack));
    try {
      node.op->callBoxed(&stack);
    } catch (const std::exception& e) {
      // Out of memory is no fault of the input: it goes on as LibTorch's own
      // error, which the stage answers with RESOURCE_EXHAUSTED.
      if (IsOutOfMemory(e)) throw;
      return absl::InvalidArgumentError("model.exported: node '" + node.name + "' (" + node.target +
                                        ") failed: " + WithoutBacktrace(e).substr(0, 600));
    }
    for (std::size_t k = 0; k < node.outs.size() && k < stack.size(); ++k) {
      const std::vector<int>& slots = node.outs[k];
      if (slots.empty()) continue;
      const c10::IValue& v = stack[k];
      if (v.isTensor()) {
        values[static_cast<std::size_t>(slots[0])] = v.toTensor();
      } else if (v.isTensorList()) {
        const auto list = v.toTensorList();
        for (std::size_t j = 0; j < slots.size() && j < list.size(); ++j)
          values[static_cast<std::size_t>(slots[j])] = list.get(j);
      }
    }
    return absl::OkStatus();
  }

  std::shared_ptr<const Program> program_;
  int begin_, end_;
  std::vector<NamedTensors> params_, buffers_;  // per layer held
  NamedTensors copies_;                          // buffers the replayed nodes read
  std::vector<std::pair<int, at::Tensor>> held_slots_;  // each held tensor's placeholder slot
  bool training_ = true;
  c10::Device device_{c10::kCPU};  // its tensors' (To)
  const bool fuse_;
};

}  // namespace

std::unique_ptr<Partition> MakeExportedPartition(std::shared_ptr<const Program> program, int begin, int end,
                                                 std::map<std::string, at::Tensor> held,
                                                 std::map<std::string, at::Tensor> copies, bool fuse) {
  return std::unique_ptr<Partition>(
      new ExportedPartition(std::move(program), begin, end, std::move(held), std::move(copies), fuse));
}

}  // namespace conveyor::exported
