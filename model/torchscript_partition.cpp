#include "model/torchscript_partition.h"

#include <sys/stat.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/script.h>

#include <map>
#include <mutex>

#include "model/out_of_memory.h"

namespace conveyor {
namespace {

std::string FirstLine(const std::string& s) { return s.substr(0, s.find('\n')); }

// What went wrong in a layer, in one line: the first of a LibTorch error's
// message, or the last of the TorchScript interpreter's (it rethrows any error
// as a std::runtime_error of a traceback that ends with the error itself).
std::string ErrorLine(const std::exception& e) {
  const std::string what = ErrorMessage(e);
  if (what.rfind("The following operation failed in the TorchScript interpreter", 0) != 0) return FirstLine(what);
  const std::size_t end = what.find_last_not_of("\n ");
  if (end == std::string::npos) return what;
  const std::size_t newline = what.rfind('\n', end);
  const std::size_t begin = newline == std::string::npos ? 0 : newline + 1;
  return what.substr(begin, end + 1 - begin);
}

// The archive's top-level module, checked to be an nn.Sequential.
StatusOr<torch::jit::Module> LoadSequential(const std::string& path) {
  static std::once_flag once;
  std::call_once(once, [] { torch::jit::setGraphExecutorOptimize(false); });
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return absl::NotFoundError("model.torchscript: " + path + " does not exist");
  torch::jit::Module m;
  try {
    m = torch::jit::load(path, c10::Device(c10::kCPU));
  } catch (const std::exception& e) {
    const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
    // torch.save(model) and torch.save(model.state_dict()) write pickles that
    // torch.jit.load cannot read: the usual mistake, named with its fix.
    return absl::InvalidArgumentError(
        "model.torchscript: " + path + " is not a TorchScript archive (" +
        FirstLine(c10_error ? c10_error->what_without_backtrace() : e.what()) +
        "); torch.save(model) and torch.save(model.state_dict()) write pickles: save the model with "
        "torch.jit.script(model).save(PATH), and give a state_dict as init_from");
  }
  const std::string type = m.type()->name() ? m.type()->name()->qualifiedName() : "?";
  const std::string last = type.substr(type.rfind('.') + 1);
  if (last != "Sequential") {
    return absl::InvalidArgumentError("model.torchscript: the top-level module of " + path + " is " + type +
                                      ", not an nn.Sequential: Conveyor cuts a model between the children of a "
                                      "Sequential (see docs/models.md)");
  }
  return m;
}

NamedTensors Named(const torch::jit::named_parameter_list& list) {
  NamedTensors out;
  for (const auto& p : list) out.emplace_back(p.name, p.value);
  return out;
}

NamedTensors Named(const torch::jit::named_buffer_list& list) {
  NamedTensors out;
  for (const auto& b : list) out.emplace_back(b.name, b.value);
  return out;
}

// Pairs of layers whose parameters share storage.
std::vector<std::pair<int, int>> TiedLayers(const std::vector<torch::jit::Module>& children) {
  std::map<const void*, int> owner;
  std::vector<std::pair<int, int>> tied;
  for (int i = 0; i < static_cast<int>(children.size()); ++i) {
    for (const auto& p : children[static_cast<std::size_t>(i)].parameters(true)) {
      const void* key = p.storage().data();
      auto [it, fresh] = owner.emplace(key, i);
      if (!fresh && it->second != i) tied.emplace_back(it->second, i);
    }
  }
  return tied;
}

// What crosses a stage boundary: a tensor, or a tuple of two or more
// tensors, flattened in order. Anything else (nesting, lists, dicts, None)
// is refused naming the layer that returns it.
StatusOr<Tensors> Flatten(const c10::IValue& x, const std::string& who) {
  if (x.isTensor()) return Tensors{x.toTensor()};
  if (x.isTuple()) {
    const auto& elements = x.toTuple()->elements();
    Tensors out;
    for (const c10::IValue& e : elements) {
      if (!e.isTensor()) break;
      out.push_back(e.toTensor());
    }
    if (out.size() == elements.size() && out.size() >= 2) return out;
  }
  return absl::InvalidArgumentError(who + " returns " + x.type()->str() +
                                    ": what crosses a stage boundary is a tensor or a flat tuple of two or more "
                                    "tensors (no nesting, lists, dicts or None); cut the model elsewhere");
}

class TorchScriptPartition final : public Partition {
 public:
  TorchScriptPartition(std::vector<torch::jit::Module> children, std::vector<Layer> layers)
      : children_(std::move(children)) {
    layers_ = std::move(layers);
  }

  StatusOr<Tensors> Forward(const Tensors& inputs) override {
    c10::IValue x = inputs.size() == 1 ? c10::IValue(inputs.front())
                                       : c10::IValue(c10::ivalue::Tuple::create(
                                             std::vector<c10::IValue>(inputs.begin(), inputs.end())));
    // Seeded per layer (training): the generators are the process's, so
    // nothing else may draw between the seed and the layer's last draw.
    const bool seeded = random_key_.has_value() && is_training();
    std::unique_lock<std::mutex> lock(DefaultGeneratorMutex(), std::defer_lock);
    if (seeded) lock.lock();
    for (std::size_t i = 0; i < children_.size(); ++i) {
      try {
        if (seeded) {
          const uint64_t seed = DropoutSeed(random_key_->seed, random_key_->step, random_key_->micro_batch,
                                            layers_[i].index);
          at::manual_seed(seed);  // CPU, and every CUDA device where there are any
        }
        x = children_[i].forward({x});
      } catch (const std::exception& e) {  // c10::Error, or the interpreter's std::runtime_error
        // Out of memory is no fault of the input: it goes on as LibTorch's own
        // error, which the stage answers with RESOURCE_EXHAUSTED and what it held.
        if (IsOutOfMemory(e)) C10_THROW_ERROR(OutOfMemoryError, LayerWho(i) + ": " + ErrorLine(e));
        return absl::InvalidArgumentError(LayerWho(i) + ": " + ErrorLine(e));
      }
    }
    return Flatten(x, LayerWho(children_.size() - 1));
  }

  NamedTensors LayerParameters(int i) const override {
    return Named(children_[static_cast<std::size_t>(i)].named_parameters(true));
  }
  NamedTensors LayerBuffers(int i) const override {
    return Named(children_[static_cast<std::size_t>(i)].named_buffers(true));
  }
  void To(const c10::Device& device, c10::ScalarType dtype) override {
    for (auto& c : children_) {
      if (dtype == c10::ScalarType::Undefined) {
        c.to(device);
      } else {
        c.to(device, dtype);
      }
    }
  }
  void Train(bool on) override {
    for (auto& c : children_) c.train(on);
  }
  bool is_training() const override { return children_.empty() || children_.front().is_training(); }

 private:
  std::string LayerWho(std::size_t i) const {
    return "layer " + std::to_string(layers_[i].index) + " (" + layers_[i].name + ")";
  }

  std::vector<torch::jit::Module> children_;
};

}  // namespace

StatusOr<TorchScriptSummary> DescribeTorchScript(const std::string& path) {
  CONVEYOR_ASSIGN_OR_RETURN(torch::jit::Module m, LoadSequential(path));
  TorchScriptSummary s;
  std::vector<torch::jit::Module> children;
  for (const auto& child : m.named_children()) {
    s.layer_names.push_back(child.name);
    int64_t n = 0;
    for (const auto& p : child.value.parameters(true)) n += p.numel();
    s.layer_parameters.push_back(n);
    children.push_back(child.value);
  }
  if (s.layer_names.empty())
    return absl::InvalidArgumentError("model.torchscript: " + path + " is an empty nn.Sequential");
  s.tied_layers = TiedLayers(children);
  return s;
}

StatusOr<std::unique_ptr<Partition>> LoadTorchScriptPartition(const std::string& path, int begin, int end) {
  CONVEYOR_ASSIGN_OR_RETURN(torch::jit::Module m, LoadSequential(path));
  std::vector<torch::jit::Module> all;
  std::vector<std::string> names;
  for (const auto& child : m.named_children()) {
    all.push_back(child.value);
    names.push_back(child.name);
  }
  const int n = static_cast<int>(all.size());
  if (begin < 0 || end > n || begin >= end) {
    return absl::InvalidArgumentError("layers [" + std::to_string(begin) + ", " + std::to_string(end) + ") of " +
                                      path + ", which has " + std::to_string(n) + " layers");
  }
  for (const auto& [a, b] : TiedLayers(all)) {
    const bool in_a = a >= begin && a < end, in_b = b >= begin && b < end;
    if (in_a != in_b) {
      return absl::InvalidArgumentError(
          "layers " + std::to_string(a) + " (" + names[static_cast<std::size_t>(a)] + ") and " + std::to_string(b) +
          " (" + names[static_cast<std::size_t>(b)] +
          ") share parameters (tied weights) but fall on different stages: two copies would train apart. Keep "
          "them on one stage (partition.boundaries) or untie them");
    }
  }
  std::vector<torch::jit::Module> mine(all.begin() + begin, all.begin() + end);
  std::vector<Partition::Layer> layers;
  for (int i = begin; i < end; ++i) layers.push_back({i, names[static_cast<std::size_t>(i)]});
  return std::unique_ptr<Partition>(new TorchScriptPartition(std::move(mine), std::move(layers)));
}

}  // namespace conveyor
