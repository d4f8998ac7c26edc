#include "model/partition.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <map>

#include "model/dataset.h"
#include "common/files.h"
#include "common/sha256.h"
#include "plan/model_catalog.h"
#include "transport/tensor_codec.h"
#include "common/wire.h"
#include "model/exported_program.h"
#include "model/torchscript_partition.h"
#include "model/zoo_partition.h"

namespace conveyor {
namespace {

std::vector<int64_t> ToVector(at::IntArrayRef a) { return std::vector<int64_t>(a.begin(), a.end()); }

// A layer without a name of its own (an exported program's) names its tensors in full.
std::string QualifiedName(const std::string& layer, const std::string& name) {
  return layer.empty() ? name : layer + "." + name;
}

}  // namespace

uint64_t DropoutSeed(uint64_t seed, int64_t step, int micro_batch, int layer) {
  return MixSeed(MixSeed(MixSeed(seed, static_cast<uint64_t>(step)), static_cast<uint64_t>(micro_batch)),
                 static_cast<uint64_t>(layer));
}

std::mutex& DefaultGeneratorMutex() {
  static std::mutex mu;
  return mu;
}

StatusOr<at::Tensor> Partition::ForwardOne(const at::Tensor& input) {
  CONVEYOR_ASSIGN_OR_RETURN(Tensors out, Forward({input}));
  if (out.size() != 1) {
    return absl::InvalidArgumentError("layer " + std::to_string(layers_.back().index) + " (" + layers_.back().name +
                                      ") returns a tuple of " + std::to_string(out.size()) +
                                      " tensors where one tensor is needed");
  }
  return std::move(out.front());
}

NamedTensors Partition::NamedParameters() const {
  NamedTensors out;
  for (int i = 0; i < num_layers(); ++i)
    for (auto& [name, t] : LayerParameters(i)) out.emplace_back(QualifiedName(layer_name(i), name), t);
  return out;
}

NamedTensors Partition::NamedBuffers() const {
  NamedTensors out;
  for (int i = 0; i < num_layers(); ++i)
    for (auto& [name, t] : LayerBuffers(i)) out.emplace_back(QualifiedName(layer_name(i), name), t);
  return out;
}

std::vector<at::Tensor> Partition::Parameters() const {
  std::vector<at::Tensor> out;
  for (auto& [name, t] : NamedParameters()) out.push_back(t);
  return out;
}

std::vector<at::Tensor> Partition::Buffers() const {
  std::vector<at::Tensor> out;
  for (auto& [name, t] : NamedBuffers()) out.push_back(t);
  return out;
}

std::string Partition::LayerDigest(int i) const {
  Sha256 h;
  auto add = [&h](const std::string& kind, const NamedTensors& tensors) {
    for (const auto& [name, value] : tensors) {
      at::Tensor t = value.detach().to(at::kCPU).contiguous();
      h.Update(kind + name + "|" + std::string(c10::toString(t.scalar_type())) + "|");
      for (int64_t d : t.sizes()) h.Update(std::to_string(d) + ",");
      h.Update(t.data_ptr(), static_cast<std::size_t>(t.numel()) * t.element_size());
    }
  };
  add("", LayerParameters(i));
  add("buffer:", LayerBuffers(i));  // BatchNorm's running statistics are state too
  return h.Final();
}

// The model's layer names: the zoo's are their indices; an archive's come
// from the coordinator's description of it.
std::vector<std::string> ModelLayerNames(const v1::JobSpec& spec) {
  const auto& m = spec.model();
  if (ModelFromFile(m)) return {m.layer_names().begin(), m.layer_names().end()};
  std::vector<std::string> names;
  for (int i = 0; i < NumLayers(m); ++i) names.push_back(std::to_string(i));
  return names;
}

// init_from's keys must all be the model's: the layer before the first dot
// is one of its layers (what load_state_dict(strict=True) calls unexpected).
Status CheckInitialWeightNames(const v1::JobSpec& spec, const NamedTensors& weights) {
  const std::vector<std::string> layers = ModelLayerNames(spec);
  for (const auto& [name, t] : weights) {
    const std::string layer = name.substr(0, name.find('.'));
    if (std::find(layers.begin(), layers.end(), layer) == layers.end()) {
      return absl::InvalidArgumentError("init_from: " + spec.init_from() + " has '" + name +
                                        "', which is no parameter or buffer of the model (unexpected key)");
    }
  }
  return absl::OkStatus();
}

// Copies init_from's tensors into `layers` by name: every parameter and
// buffer held must be there with its shape (missing or mis-shaped: named).
Status LoadInitialWeights(const v1::JobSpec& spec, const NamedTensors& weights, Partition& layers) {
  std::map<std::string, const at::Tensor*> by_name;
  for (const auto& [name, t] : weights) by_name[name] = &t;
  at::NoGradGuard no_grad;
  for (const NamedTensors& mine : {layers.NamedParameters(), layers.NamedBuffers()}) {
    for (auto [name, t] : mine) {  // t shares the parameter's storage
      auto it = by_name.find(name);
      if (it == by_name.end())
        return absl::InvalidArgumentError("init_from: " + spec.init_from() + " has no '" + name + "' (missing key)");
      if (it->second->sizes() != t.sizes()) {
        return absl::InvalidArgumentError("init_from: '" + name + "' is " + ShapeString(ToVector(it->second->sizes())) +
                                          " in " + spec.init_from() + ", the model's is " +
                                          ShapeString(ToVector(t.sizes())));
      }
      t.copy_(*it->second);
    }
  }
  return absl::OkStatus();
}

StatusOr<std::unique_ptr<Partition>> BuildPartition(const v1::JobSpec& spec, int begin, int end, bool init) {
  std::unique_ptr<Partition> p;
  if (spec.model().kind() == v1::MODEL_EXPORTED) {
    CONVEYOR_ASSIGN_OR_RETURN(p, LoadExportedPartition(spec.model().exported(), spec.model().cut_before(), begin, end,
                                                       /*fuse=*/!spec.model().unfused_qkv()));
  } else if (spec.model().kind() == v1::MODEL_TORCHSCRIPT) {
    CONVEYOR_ASSIGN_OR_RETURN(p, LoadTorchScriptPartition(spec.model().torchscript(), begin, end));
  } else {
    return BuildZooPartition(spec, begin, end, init);
  }
  if (spec.precision() == v1::PRECISION_BF16) p->To(at::kCPU, at::kBFloat16);
  return p;
}

bool UsesChannelsLast(const v1::JobSpec& spec, const c10::Device& device) {
  switch (spec.memory_format()) {
    case v1::MEMORY_FORMAT_CHANNELS_LAST: return true;
    case v1::MEMORY_FORMAT_CONTIGUOUS: return false;
    default:
      return device.is_cuda() &&
             (spec.model().kind() == v1::MODEL_RESNET50 || spec.model().kind() == v1::MODEL_CONVNET);
  }
}

void ToChannelsLast(Partition& layers) {
  at::NoGradGuard no_grad;
  for (const std::vector<at::Tensor>& ts : {layers.Parameters(), layers.Buffers()}) {
    for (at::Tensor t : ts) {
      if (t.dim() == 4) t.set_data(t.data().contiguous(at::MemoryFormat::ChannelsLast));
    }
  }
}

StatusOr<v1::DescribeReply> DescribeJob(const v1::JobSpec& spec) {
  v1::DescribeReply reply;
  auto layers = [&](const std::vector<std::string>& names, const std::vector<int64_t>& parameters) {
    reply.set_num_layers(static_cast<int>(names.size()));
    for (const auto& n : names) reply.add_layer_names(n);
    for (int64_t n : parameters) reply.add_layer_parameters(n);
  };
  if (spec.model().kind() == v1::MODEL_EXPORTED) {
    CONVEYOR_ASSIGN_OR_RETURN(ExportedSummary s, DescribeExportedProgram(spec.model().exported(), spec.model().cut_before()));
    layers(s.layer_names, s.layer_parameters);
  } else if (spec.model().kind() == v1::MODEL_TORCHSCRIPT) {
    CONVEYOR_ASSIGN_OR_RETURN(TorchScriptSummary s, DescribeTorchScript(spec.model().torchscript()));
    layers(s.layer_names, s.layer_parameters);
  } else {
    reply.set_num_layers(NumLayers(spec.model()));
  }
  // tensors: the file's own shapes and dtypes; tokens: int64 windows {seq_len}
  // (the file is opened all the same, so a bad one fails the job here).
  if (spec.data().kind() == v1::DATA_TENSORS || spec.data().kind() == v1::DATA_TOKENS) {
    CONVEYOR_ASSIGN_OR_RETURN(auto data, Dataset::Open(spec, /*inputs=*/true, /*labels=*/true));
    const at::Tensor x = data->SampleOf(true), y = data->SampleOf(false);
    for (int64_t d : x.sizes()) reply.add_input_sample_shape(d);
    for (int64_t d : y.sizes()) reply.add_target_sample_shape(d);
    auto xd = ToWireDType(x.scalar_type());
    if (!xd.ok()) return Annotate(xd.status(), "data.train: the inputs");
    auto yd = ToWireDType(y.scalar_type());
    if (!yd.ok()) return Annotate(yd.status(), "data.train: the targets");
    reply.set_input_dtype(*xd);
    reply.set_target_dtype(*yd);
  }
  return reply;
}

}  // namespace conveyor
