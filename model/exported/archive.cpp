// Reading a .pt2 archive (torch.export.save): its graph and signature
// (models/model.json), where each state tensor lies (model_weights_config.json),
// each node's operator found in this LibTorch's dispatcher; then the layers,
// the crossings and the argument plans (layers.cpp, argument_plans.cpp).
#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>

#include "model/exported/program.h"

namespace conveyor::exported {
namespace {

// "torch.ops.aten.add_.Tensor" -> {"aten::add_", "Tensor"}; "default" -> "".
std::optional<c10::OperatorName> OperatorNameOf(const std::string& target) {
  const std::string prefix = "torch.ops.";
  if (target.rfind(prefix, 0) != 0) return std::nullopt;
  std::vector<std::string> parts;
  std::stringstream in(target.substr(prefix.size()));
  for (std::string part; std::getline(in, part, '.');) parts.push_back(part);
  if (parts.size() != 3) return std::nullopt;
  return c10::OperatorName(parts[0] + "::" + parts[1], parts[2] == "default" ? "" : parts[2]);
}

bool IsPipeSplit(const std::string& target) { return target.find("_pipe_split") != std::string::npos; }

// nn_module_stack: "L__self__,,__main__.CNN;L__self__conv,conv,torch.nn.modules.conv.Conv2d".
std::vector<std::string> ModulePaths(const json& metadata) {
  std::vector<std::string> out;
  if (!metadata.contains("nn_module_stack")) return out;
  std::stringstream in(metadata.at("nn_module_stack").get<std::string>());
  for (std::string entry; std::getline(in, entry, ';');) {
    const std::size_t a = entry.find(',');
    const std::size_t b = a == std::string::npos ? a : entry.find(',', a + 1);
    if (b == std::string::npos) continue;
    const std::string path = entry.substr(a + 1, b - a - 1);
    if (!path.empty()) out.push_back(path);
  }
  return out;
}

// A state tensor's dtype and sizes, as the archive's config records them.
struct WeightMeta {
  at::ScalarType dtype;
  std::vector<int64_t> sizes, strides;
  int64_t offset = 0;
};

StatusOr<WeightMeta> MetaOf(const Program& p, const std::string& name, const json& entry) {
  if (entry.value("use_pickle", false))
    return Bad(p, "'" + name + "' is stored pickled, which this reader does not read");
  const json& meta = entry.at("tensor_meta");
  const auto dtype = ScalarTypeOf(meta.at("dtype").get<int>());
  if (!dtype) return Bad(p, "'" + name + "' has dtype code " + meta.at("dtype").dump() + ", not read here");
  WeightMeta m{*dtype, {}, {}, 0};
  for (const json& s : meta.at("sizes")) {
    if (!s.contains("as_int")) return Bad(p, "'" + name + "' has a symbolic size");
    m.sizes.push_back(s.at("as_int").get<int64_t>());
  }
  for (const json& s : meta.at("strides")) m.strides.push_back(s.value("as_int", int64_t{0}));
  if (meta.contains("storage_offset")) m.offset = meta.at("storage_offset").value("as_int", int64_t{0});
  return m;
}

std::vector<std::string> SplitNames(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream in(list);
  for (std::string item; std::getline(in, item, ',');) {
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// The archive's reader, its models/model.json and (where present) its
// data/weights/model_weights_config.json.
Status OpenArchive(Program& p, json* model, json* weights) {
  try {
    p.reader = std::make_shared<caffe2::serialize::PyTorchStreamReader>(p.path);
    if (!p.reader->hasRecord("models/model.json"))
      return Bad(p, "not a program saved by torch.export.save (no models/model.json in the archive)");
    auto [data, n] = p.reader->getRecord("models/model.json");
    *model = json::parse(static_cast<const char*>(data.get()), static_cast<const char*>(data.get()) + n);
    if (p.reader->hasRecord("data/weights/model_weights_config.json")) {
      auto [w, m] = p.reader->getRecord("data/weights/model_weights_config.json");
      *weights = json::parse(static_cast<const char*>(w.get()), static_cast<const char*>(w.get()) + m);
    }
  } catch (const std::exception& e) {
    return Bad(p, std::string("not a program saved by torch.export.save: ") + WithoutBacktrace(e));
  }
  return absl::OkStatus();
}

// The signature: which placeholders are state (parameters, buffers), which
// the caller's, and what the graph returns.
Status ReadSignature(Program& p, const json& signature) {
  for (const json& spec : signature.at("input_specs")) {
    if (spec.contains("parameter")) {
      const std::string ph = spec.at("parameter").at("arg").at("name"), name = spec.at("parameter").at("parameter_name");
      p.state_of[ph] = name;
      p.parameters.insert(name);
      p.state_order.push_back(name);
    } else if (spec.contains("buffer")) {
      const std::string ph = spec.at("buffer").at("arg").at("name"), name = spec.at("buffer").at("buffer_name");
      p.state_of[ph] = name;
      p.state_order.push_back(name);
    } else if (spec.contains("user_input")) {
      const json& arg = spec.at("user_input").at("arg");
      if (!arg.contains("as_tensor")) return Bad(p, "an input that is not a tensor: " + arg.dump());
      p.user_inputs.push_back(arg.at("as_tensor").at("name"));
    } else {
      return Bad(p, "an input this reader does not take (constants, tokens, custom objects): " + spec.dump());
    }
  }
  for (const json& spec : signature.at("output_specs")) {
    if (!spec.contains("user_output")) {
      return Bad(p, "an output other than the model's (a mutated buffer or a gradient): " + spec.dump() +
                        "; export the module itself (torch.export.export(model, args))");
    }
    const json& arg = spec.at("user_output").at("arg");
    if (!arg.contains("as_tensor")) return Bad(p, "an output that is not a tensor: " + arg.dump());
    p.user_outputs.push_back(arg.at("as_tensor").at("name"));
  }
  return absl::OkStatus();
}

// Where the state lies in the archive (each partition reads its own).
Status ReadStateConfig(Program& p, const json& weights) {
  const json& config = weights.contains("config") ? weights.at("config") : json::object();
  for (const std::string& name : p.state_order) {
    if (!config.contains(name)) return Bad(p, "the archive has no weights for '" + name + "'");
    CONVEYOR_ASSIGN_OR_RETURN(WeightMeta meta, MetaOf(p, name, config[name]));
    int64_t n = 1;
    for (int64_t d : meta.sizes) n *= d;
    p.numel[name] = n;
    p.weights[name] = config[name];
  }
  return absl::OkStatus();
}

// The nodes, each operator looked up in this LibTorch's dispatcher; the
// pipe_split nodes are not kept, their positions go to `cuts`.
Status ReadNodes(Program& p, const json& graph, std::vector<std::size_t>* cuts) {
  for (const json& n : graph.at("nodes")) {
    Node node;
    node.name = n.value("name", std::string());
    node.target = n.at("target").get<std::string>();
    node.inputs = n.at("inputs");
    node.outputs = n.at("outputs");
    if (n.contains("metadata")) node.modules = ModulePaths(n.at("metadata"));
    if (IsPipeSplit(node.target)) {
      cuts->push_back(p.nodes.size());
      continue;
    }
    if (OnSizesOnly(node.target, node.outputs)) continue;
    auto op_name = OperatorNameOf(node.target);
    if (!op_name) {
      return Bad(p, "node '" + node.name + "' calls " + node.target +
                        ", which is not an operator this route runs (higher-order operators and Python "
                        "functions are not)");
    }
    auto found = c10::Dispatcher::singleton().findSchema(*op_name);  // c10::optional in 1.13, std:: in 2.x
    if (found) node.op = *found;
    if (!node.op) {
      return Bad(p, "node '" + node.name + "' calls " + node.target + " (" + op_name->name +
                        (op_name->overload_name.empty() ? "" : "." + op_name->overload_name) +
                        "), which this LibTorch does not have");
    }
    for (const json& in : node.inputs) CollectReads(in.at("arg"), &node.reads);
    p.nodes.push_back(std::move(node));
  }
  return absl::OkStatus();
}

// cut_before: a cut before the first node inside each module named.
Status CutBefore(const Program& p, const std::string& cut_before, std::vector<std::size_t>* cuts) {
  for (const std::string& module : SplitNames(cut_before)) {
    std::size_t at = p.nodes.size();
    for (std::size_t i = 0; i < p.nodes.size() && at == p.nodes.size(); ++i) {
      const auto& m = p.nodes[i].modules;
      if (std::find(m.begin(), m.end(), module) != m.end()) at = i;
    }
    if (at == p.nodes.size()) {
      std::set<std::string> known;
      for (const Node& n : p.nodes)
        for (const std::string& m : n.modules) known.insert(m);
      std::string list;
      for (const std::string& m : known) list += (list.empty() ? "" : ", ") + m;
      return Bad(p, "cut_before: no module '" + module + "' in the program (its modules: " + list + ")");
    }
    cuts->push_back(at);
  }
  return absl::OkStatus();
}

// The graph: its symbolic sizes, signature, state, nodes and cuts; a
// json::exception where it is not as torch.export.save writes it.
Status ReadGraph(Program& p, const json& model, const json& weights, const std::string& cut_before,
                 json* tensor_values, std::vector<std::size_t>* cuts) {
  const json& gm = model.at("graph_module");
  const json& graph = gm.at("graph");
  CONVEYOR_RETURN_IF_ERROR(ReadSymValues(p, graph));
  if (graph.contains("tensor_values")) *tensor_values = graph.at("tensor_values");
  CONVEYOR_RETURN_IF_ERROR(ReadSignature(p, gm.at("signature")));
  CONVEYOR_RETURN_IF_ERROR(ReadStateConfig(p, weights));
  CONVEYOR_RETURN_IF_ERROR(ReadNodes(p, graph, cuts));
  return CutBefore(p, cut_before, cuts);
}

}  // namespace

StatusOr<at::Tensor> ReadWeight(const Program& p, const std::string& name) {
  const json& entry = p.weights.at(name);
  CONVEYOR_ASSIGN_OR_RETURN(WeightMeta meta, MetaOf(p, name, entry));
  const std::vector<int64_t>& sizes = meta.sizes;
  const std::vector<int64_t>& strides = meta.strides;
  const std::string record = "data/weights/" + entry.at("path_name").get<std::string>();
  if (!p.reader->hasRecord(record)) return Bad(p, "'" + name + "': the archive has no " + record);
  auto [data, bytes] = p.reader->getRecord(record);
  const auto dtype = std::optional<at::ScalarType>(meta.dtype);
  at::Tensor t = at::empty(sizes, at::TensorOptions().dtype(*dtype));
  const std::size_t want = static_cast<std::size_t>(t.numel()) * t.element_size();
  // A tensor stored with its storage (a view's): the bytes of that storage, read
  // with the recorded strides; usually the plain contiguous bytes.
  if (bytes == want) {
    std::memcpy(t.data_ptr(), data.get(), want);
  } else {
    const int64_t offset = meta.offset;
    at::Tensor storage = at::empty({static_cast<int64_t>(bytes / t.element_size())}, t.options());
    std::memcpy(storage.data_ptr(), data.get(), static_cast<std::size_t>(storage.numel()) * t.element_size());
    if (strides.size() != sizes.size()) return Bad(p, "'" + name + "': " + std::to_string(bytes) + " bytes stored");
    t.copy_(storage.as_strided(sizes, strides, offset));
  }
  return t;
}

StatusOr<std::shared_ptr<const Program>> ReadProgram(const std::string& path, const std::string& cut_before) {
  auto p = std::make_shared<Program>();
  p->path = path;
  if (!std::ifstream(path).good()) return absl::NotFoundError("model.exported: no file " + path);
  json model, weights, tensor_values;
  CONVEYOR_RETURN_IF_ERROR(OpenArchive(*p, &model, &weights));
  std::vector<std::size_t> cuts;  // node indices a layer starts at
  // Every json access throws on a key or type the archive lacks (.at(), never
  // a const operator[], which reads past the end there): a damaged archive is
  // an error, not a crash.
  // What else a damaged graph throws (a std::map's at() on a name that no
  // node makes, say) is refused the same way: a reader of a file a job names
  // returns an error, it never throws (fuzz_exported_program).
  try {
    CONVEYOR_RETURN_IF_ERROR(ReadGraph(*p, model, weights, cut_before, &tensor_values, &cuts));
    MakeLayers(*p, cuts);
    CONVEYOR_RETURN_IF_ERROR(FindCrossings(*p));
  } catch (const std::exception& e) {
    return Bad(*p, std::string("the program's graph is not as torch.export.save writes it: ") + WithoutBacktrace(e));
  }
  try {
    BindSymbols(*p, tensor_values);
  } catch (const std::exception& e) {
    return Bad(*p, std::string("the program's tensor_values are not as torch.export.save writes them: ") +
                       WithoutBacktrace(e));
  }
  try {
    CONVEYOR_RETURN_IF_ERROR(Compile(*p));
  } catch (const std::exception& e) {
    return Bad(*p, std::string("an argument of the program's graph is not as torch.export.save writes it: ") +
                       WithoutBacktrace(e));
  }
  return std::shared_ptr<const Program>(std::move(p));
}

}  // namespace conveyor::exported
