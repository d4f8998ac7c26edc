#include "model/torchscript_export.h"

#include <sys/stat.h>
#include <torch/script.h>

#include <filesystem>
#include <map>
#include <set>
#include <sstream>

#include "common/files.h"
#include "model/state_dict.h"
#include "plan/job_spec.h"

namespace conveyor {

StatusOr<std::string> TorchScriptWithWeights(const std::string& path, const NamedTensors& weights) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return absl::NotFoundError("model.torchscript: " + path + " does not exist");
  try {
    torch::jit::Module m = torch::jit::load(path, c10::Device(c10::kCPU));
    std::map<std::string, at::Tensor> by_name(weights.begin(), weights.end());
    // The trained dtype (bf16 jobs): the archive takes the weights' own.
    for (const auto& p : m.named_parameters(true)) {
      auto it = by_name.find(p.name);
      if (it != by_name.end() && p.value.is_floating_point() && it->second.scalar_type() != p.value.scalar_type())
        m.to(it->second.scalar_type());
      break;
    }
    std::set<std::string> used;
    auto fill = [&](const std::string& name, at::Tensor into) -> Status {
      auto it = by_name.find(name);
      if (it == by_name.end())
        return absl::InvalidArgumentError("the weights lack " + name + ", which the archive " + path + " has");
      if (it->second.sizes() != into.sizes())
        return absl::InvalidArgumentError("weight " + name + " has shape " + c10::str(it->second.sizes()) +
                                          ", the archive's " + c10::str(into.sizes()));
      into.detach().copy_(it->second);
      used.insert(name);
      return absl::OkStatus();
    };
    at::NoGradGuard no_grad;
    for (const auto& p : m.named_parameters(true)) CONVEYOR_RETURN_IF_ERROR(fill(p.name, p.value));
    for (const auto& b : m.named_buffers(true)) CONVEYOR_RETURN_IF_ERROR(fill(b.name, b.value));
    for (const auto& [name, t] : weights) {
      if (!used.count(name))
        return absl::InvalidArgumentError("weight " + name + " is not a parameter or buffer of the archive " + path);
    }
    std::ostringstream out;
    m.save(out);
    return out.str();
  } catch (const std::exception& e) {  // c10::Error, and what torch::jit::load throws for a file that is no archive
    const std::string what = e.what();
    return absl::InvalidArgumentError("model.torchscript: " + path + ": " + what.substr(0, what.find('\n')));
  }
}

Status WriteWeights(const std::string& path, const NamedTensors& weights, const v1::ModelSpec& model,
                    bool torchscript, const std::string& key) {
  // Folders missing under the path are made (the coordinator's save and
  // `conveyor export` do the same).
  const std::filesystem::path folder = std::filesystem::path(path).parent_path();
  std::error_code made;
  if (!folder.empty()) std::filesystem::create_directories(folder, made);
  if (made) return absl::FailedPreconditionError(key + ": cannot make the folder " + folder.string() + ": " + made.message());
  if (!torchscript) return Annotate(WriteStateDict(path, weights), key);
  if (model.kind() != v1::MODEL_TORCHSCRIPT)
    return absl::InvalidArgumentError(key + ": format torchscript needs a model from a TorchScript archive (model: "
                                      "{torchscript: PATH}); " +
                                      (model.kind() == v1::MODEL_EXPORTED ? std::string("an exported program")
                                                                           : "the zoo's " + ModelName(model.kind())) +
                                      " exports as a state_dict only");
  CONVEYOR_ASSIGN_OR_RETURN(std::string archive, TorchScriptWithWeights(model.torchscript(), weights));
  return Annotate(WriteFileAtomically(path, archive), key);
}

}  // namespace conveyor
