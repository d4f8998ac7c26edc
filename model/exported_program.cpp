#include "model/exported_program.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>
#include <ATen/core/stack.h>
#include <ATen/ScalarOps.h>
#include <caffe2/serialize/inline_container.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>

#include "model/out_of_memory.h"
#include "model/split_heads.h"
#include "model/sym_expr.h"

namespace conveyor {
namespace {

// LibTorch's message without the C++ stack that c10::Error appends to what().
std::string WithoutBacktrace(const std::exception& e) {
  if (const auto* c10 = dynamic_cast<const c10::Error*>(&e)) return c10->what_without_backtrace();
  return e.what();
}

using json = nlohmann::json;

// torch/_export/serde/schema.py's ScalarType.
std::optional<at::ScalarType> ScalarTypeOf(int code) {
  switch (code) {
    case 1: return at::kByte;
    case 2: return at::kChar;
    case 3: return at::kShort;
    case 4: return at::kInt;
    case 5: return at::kLong;
    case 6: return at::kHalf;
    case 7: return at::kFloat;
    case 8: return at::kDouble;
    case 12: return at::kBool;
    case 13: return at::kBFloat16;
    default: return std::nullopt;
  }
}

// One argument of a call, resolved when the program is read: a constant, or
// where in the values the tensors come from.
struct ArgPlan {
  enum Kind {
    kConstant,
    kTensor,
    kTensorList,
    kOptionalTensorList,
    kTrainingFlag,
    kSymInt,
    kSymInts,
    kDevice,  // a device the program names (arange's): the stage's
  } kind = kConstant;
  c10::IValue constant;    // kConstant: the value as the schema takes it
  std::vector<int> slots;  // kTensor: one; the lists: each element's (-1: None)
  // kSymInt: one size, kSymInts: a list, each evaluated on the symbols a
  // forward's inputs bind (a program exported with dynamic shapes).
  std::vector<SymExpr> sizes;
  bool as_tensor = false;  // kSymInt where the operator takes a tensor (a wrapped number)
};

// A size symbol of a program exported with dynamic shapes, read from a
// tensor that enters a layer: dimension `dim` of its `input`-th tensor.
struct SymBinding {
  std::size_t input;
  int64_t dim;
  std::string symbol;
};

// One call of the graph.
struct Node {
  std::string name;    // the FX node's, for errors
  std::string target;  // as serialized: "torch.ops.aten.conv2d.default"
  std::optional<c10::OperatorHandle> op;
  json inputs;   // [{name, arg, kind}]
  json outputs;  // [{as_tensor: {name}} | {as_tensors: [...]} | ...]
  std::vector<std::string> modules;  // the module paths on its nn_module_stack, outermost first
  std::vector<std::string> reads;    // the values it reads, by name
  // Resolved (Compile): the schema's arguments in order; each return's slots
  // (a tensor: one; a list: one a element; nothing kept: empty).
  std::vector<ArgPlan> args;
  std::vector<std::vector<int>> outs;
  int counts_batches = -1;  // BatchNorm's num_batches_tracked.add_: the buffer's slot (not counted in eval)
  // Attention's q, k, v split from the qkv projection (FoldHeadSplits): on
  // the unbind, the split that runs the view and permute before it too; on
  // those two, `folded`.
  struct HeadSplit {
    int64_t heads = 0;
    int input = -1;                    // the projection's slot
    std::size_t view = 0, permute = 0;  // their nodes
  };
  std::optional<HeadSplit> split;
  bool folded = false;
};

// The archive's graph, layers and where its state lies; a partition reads
// the tensors of its own layers only (ReadWeight).
struct Program {
  std::string path;
  std::vector<Node> nodes;
  std::vector<std::string> user_inputs;         // graph placeholders fed by the caller
  std::vector<std::string> user_outputs;        // what the graph returns
  std::map<std::string, std::string> state_of;  // placeholder -> state_dict name
  std::set<std::string> parameters;             // state_dict names of the parameters
  std::shared_ptr<caffe2::serialize::PyTorchStreamReader> reader;
  std::map<std::string, json> weights;          // state_dict name -> its entry of model_weights_config.json
  std::map<std::string, int64_t> numel;         // state_dict name -> elements
  std::vector<std::string> state_order;         // the signature's order
  // Layer k runs nodes [starts[k], starts[k+1]); crossing[k] the values
  // alive at its start that depend on the batch (crossing[0]: the user
  // inputs). Those that do not (a mask or rotary table sliced from a buffer,
  // an arange) do not cross: a partition that starts at layer k runs again
  // the nodes replay[k] that made them, on its own copies of the buffers
  // replay_state[k] they read.
  std::vector<std::size_t> starts;
  std::vector<std::vector<std::string>> crossing;
  std::vector<std::vector<std::size_t>> replay;
  std::vector<std::vector<std::string>> replay_state;
  std::set<std::string> written;  // state names some node writes in place (BatchNorm's statistics)
  std::vector<std::vector<std::string>> layer_state;  // the state each layer holds, signature order
  // State that several layers use (tied): its first and last user. The first
  // holds it; a partition must hold all of them.
  std::map<std::string, std::pair<std::size_t, std::size_t>> tied;
  // Every value has a slot in a partition's values (Compile).
  std::map<std::string, int> slot_of;
  std::vector<std::vector<int>> crossing_slots;
  std::vector<int> user_output_slots;
  std::vector<std::pair<int, std::string>> state_slots;  // a placeholder's slot, its state_dict name
  // Dynamic shapes: each symbolic value's expression (graph.sym_int_values),
  // the symbols each layer's entering tensors carry as sizes, and the ones
  // each layer's nodes read.
  std::map<std::string, SymExpr> sym_values;
  std::vector<std::vector<SymBinding>> bindings;
  std::vector<std::set<std::string>> layer_symbols;
};

Status Compile(Program& p);
void FoldHeadSplits(Program& p);

Status Bad(const Program& p, const std::string& what) {
  return absl::InvalidArgumentError("model.exported: " + p.path + ": " + what);
}

// The names an argument reads (tensors, lists of them).
void CollectReads(const json& arg, std::vector<std::string>* out) {
  if (arg.contains("as_tensor")) out->push_back(arg["as_tensor"]["name"].get<std::string>());
  if (arg.contains("as_tensors"))
    for (const json& t : arg["as_tensors"]) out->push_back(t["name"].get<std::string>());
  if (arg.contains("as_optional_tensors"))
    for (const json& t : arg["as_optional_tensors"])
      if (t.contains("as_tensor")) out->push_back(t["as_tensor"]["name"].get<std::string>());
  if (arg.contains("as_optional_tensor") && arg["as_optional_tensor"].contains("as_tensor"))
    out->push_back(arg["as_optional_tensor"]["as_tensor"]["name"].get<std::string>());
}

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

// A node that computes sizes only (`aten.sym_size.int`, Python's operator.mul
// on sizes) or checks them (`_assert_scalar`) in a program exported with
// dynamic shapes: not run. The sizes it makes are evaluated from their
// expressions (graph.sym_int_values) where an operator takes them, on the
// symbols the layer's entering tensors carry, so that no integer crosses a
// cut.
bool OnSizesOnly(const std::string& target, const json& outputs) {
  for (const char* check : {"_assert_scalar", "sym_constrain_range"})
    if (target.find(check) != std::string::npos) return true;
  if (!outputs.is_array() || outputs.empty()) return false;
  for (const json& o : outputs) {
    if (!o.is_object() || o.empty() || o.begin().key().rfind("as_sym_", 0) != 0) return false;
  }
  return true;
}

// The expression of a SymInt's `as_expr`: {expr_str, hint}, or a bare string
// in older archives.
std::string ExprText(const json& as_expr) {
  return as_expr.is_string() ? as_expr.get<std::string>() : as_expr.at("expr_str").get<std::string>();
}

// A symbolic value of graph.sym_int_values: {as_expr: {expr_str, hint}} (a
// bare string in older archives) or {as_int}.
StatusOr<SymExpr> SymValueOf(const Program& p, const std::string& name, const json& v) {
  std::string text;
  if (v.contains("as_int")) {
    text = std::to_string(v["as_int"].get<int64_t>());
  } else if (v.contains("as_expr")) {
    text = ExprText(v["as_expr"]);
  } else {
    return Bad(p, "the symbolic value '" + name + "' is " + v.dump() + ", which this reader does not read");
  }
  auto e = SymExpr::Parse(text);
  if (!e.ok()) return Bad(p, "the symbolic value '" + name + "': " + std::string(e.status().message()));
  return *std::move(e);
}

// The symbol a size is, where it is one symbol alone ("s0", or 2.11's
// "Symbol('s0', positive=True, integer=True)"); empty otherwise.
std::string SymbolOf(const std::string& text) {
  auto e = SymExpr::Parse(text);
  return e.ok() ? e->symbol() : std::string();
}

// The values that do not depend on the batch: made by nodes that read only
// buffers no node writes, constants and such values, that write nothing in
// place and draw no random numbers. Records the state written (Program::written).
std::set<std::string> MarkBatchFree(Program& p) {
  std::set<std::string> written;  // placeholders some node writes in place (BatchNorm's statistics)
  std::vector<bool> writes(p.nodes.size(), false);  // by node
  for (std::size_t i = 0; i < p.nodes.size(); ++i) {
    const Node& n = p.nodes[i];
    for (const c10::Argument& a : n.op->schema().arguments()) {
      if (!a.alias_info() || !a.alias_info()->isWrite()) continue;
      writes[i] = true;
      for (const json& in : n.inputs) {
        if (in.value("name", std::string()) != a.name()) continue;
        std::vector<std::string> names;
        CollectReads(in.at("arg"), &names);
        written.insert(names.begin(), names.end());
      }
    }
  }
  std::set<std::string> free;
  for (const auto& [placeholder, name] : p.state_of) {
    if (written.count(placeholder)) p.written.insert(name);
    if (!p.parameters.count(name) && !written.count(placeholder)) free.insert(placeholder);
  }
  for (std::size_t i = 0; i < p.nodes.size(); ++i) {
    const Node& n = p.nodes[i];
    const std::string& op = n.op->schema().name();
    bool random = false;
    for (const char* word : {"rand", "dropout", "bernoulli", "normal", "uniform", "multinomial", "exponential"})
      random = random || op.find(word) != std::string::npos;
    const bool reads_free =
        std::all_of(n.reads.begin(), n.reads.end(), [&](const std::string& r) { return free.count(r) > 0; });
    const bool batch_free = !random && !writes[i] && reads_free;
    if (!batch_free) continue;
    std::vector<std::string> outs;
    for (const json& o : n.outputs) CollectReads(o, &outs);
    free.insert(outs.begin(), outs.end());
  }
  return free;
}

// Dynamic shapes: for each layer, the size symbols its entering tensors
// carry as a whole dimension (the batch's "s0" of a [s0, 8, 16] activation),
// from the graph's tensor_values.
void BindSymbols(Program& p, const json& tensor_values) {
  p.bindings.assign(p.crossing.size(), {});
  for (std::size_t k = 0; k < p.crossing.size(); ++k) {
    std::set<std::string> bound;
    for (std::size_t i = 0; i < p.crossing[k].size(); ++i) {
      auto tv = tensor_values.find(p.crossing[k][i]);
      if (tv == tensor_values.end()) continue;
      const json& meta = tv->contains("meta") ? (*tv)["meta"] : *tv;  // TensorValue{meta} in older archives
      if (!meta.contains("sizes")) continue;
      int64_t d = 0;
      for (const json& size : meta["sizes"]) {
        if (size.contains("as_expr")) {
          const std::string symbol = SymbolOf(ExprText(size["as_expr"]));
          if (!symbol.empty() && bound.insert(symbol).second) p.bindings[k].push_back({i, d, symbol});
        }
        ++d;
      }
    }
  }
}

// nn_module_stack: "L__self__,,__main__.CNN;L__self__conv,conv,torch.nn.modules.conv.Conv2d".
std::vector<std::string> ModulePaths(const json& metadata) {
  std::vector<std::string> out;
  if (!metadata.contains("nn_module_stack")) return out;
  std::stringstream in(metadata["nn_module_stack"].get<std::string>());
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
  if (!dtype) return Bad(p, "'" + name + "' has dtype code " + meta["dtype"].dump() + ", not read here");
  WeightMeta m{*dtype, {}, {}, 0};
  for (const json& s : meta.at("sizes")) {
    if (!s.contains("as_int")) return Bad(p, "'" + name + "' has a symbolic size");
    m.sizes.push_back(s["as_int"].get<int64_t>());
  }
  for (const json& s : meta.at("strides")) m.strides.push_back(s.value("as_int", int64_t{0}));
  if (meta.contains("storage_offset")) m.offset = meta["storage_offset"].value("as_int", int64_t{0});
  return m;
}

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

StatusOr<std::shared_ptr<const Program>> ReadProgram(const std::string& path, const std::string& cut_before) {
  auto p = std::make_shared<Program>();
  p->path = path;
  if (!std::ifstream(path).good()) return absl::NotFoundError("model.exported: no file " + path);
  std::shared_ptr<caffe2::serialize::PyTorchStreamReader> reader;
  json model, weights, tensor_values;
  std::vector<std::size_t> cuts;  // node indices a layer starts at
  try {
    reader = std::make_shared<caffe2::serialize::PyTorchStreamReader>(path);
    if (!reader->hasRecord("models/model.json"))
      return Bad(*p, "not a program saved by torch.export.save (no models/model.json in the archive)");
    auto [data, n] = reader->getRecord("models/model.json");
    model = json::parse(static_cast<const char*>(data.get()), static_cast<const char*>(data.get()) + n);
    if (reader->hasRecord("data/weights/model_weights_config.json")) {
      auto [w, m] = reader->getRecord("data/weights/model_weights_config.json");
      weights = json::parse(static_cast<const char*>(w.get()), static_cast<const char*>(w.get()) + m);
    }
  } catch (const std::exception& e) {
    return Bad(*p, std::string("not a program saved by torch.export.save: ") + WithoutBacktrace(e));
  }
  try {
    const json& gm = model.at("graph_module");
    const json& graph = gm.at("graph");
    if (graph.contains("sym_int_values")) {
      for (const auto& [name, v] : graph["sym_int_values"].items()) {
        CONVEYOR_ASSIGN_OR_RETURN(SymExpr e, SymValueOf(*p, name, v));
        p->sym_values.emplace(name, std::move(e));
      }
    }
    if (graph.contains("tensor_values")) tensor_values = graph["tensor_values"];
    // The signature: which placeholders are state, which the caller's.
    for (const json& spec : gm.at("signature").at("input_specs")) {
      if (spec.contains("parameter")) {
        const std::string ph = spec["parameter"]["arg"]["name"], name = spec["parameter"]["parameter_name"];
        p->state_of[ph] = name;
        p->parameters.insert(name);
        p->state_order.push_back(name);
      } else if (spec.contains("buffer")) {
        const std::string ph = spec["buffer"]["arg"]["name"], name = spec["buffer"]["buffer_name"];
        p->state_of[ph] = name;
        p->state_order.push_back(name);
      } else if (spec.contains("user_input")) {
        const json& arg = spec["user_input"]["arg"];
        if (!arg.contains("as_tensor")) return Bad(*p, "an input that is not a tensor: " + arg.dump());
        p->user_inputs.push_back(arg["as_tensor"]["name"]);
      } else {
        return Bad(*p, "an input this reader does not take (constants, tokens, custom objects): " + spec.dump());
      }
    }
    for (const json& spec : gm.at("signature").at("output_specs")) {
      if (!spec.contains("user_output")) {
        return Bad(*p, "an output other than the model's (a mutated buffer or a gradient): " + spec.dump() +
                           "; export the module itself (torch.export.export(model, args))");
      }
      const json& arg = spec["user_output"]["arg"];
      if (!arg.contains("as_tensor")) return Bad(*p, "an output that is not a tensor: " + arg.dump());
      p->user_outputs.push_back(arg["as_tensor"]["name"]);
    }
    // Where the state lies in the archive (each partition reads its own).
    p->reader = reader;
    const json& config = weights.contains("config") ? weights["config"] : json::object();
    for (const std::string& name : p->state_order) {
      if (!config.contains(name)) return Bad(*p, "the archive has no weights for '" + name + "'");
      CONVEYOR_ASSIGN_OR_RETURN(WeightMeta meta, MetaOf(*p, name, config[name]));
      int64_t n = 1;
      for (int64_t d : meta.sizes) n *= d;
      p->numel[name] = n;
      p->weights[name] = config[name];
    }
    // The nodes, each operator looked up in this LibTorch's dispatcher.
    for (const json& n : graph.at("nodes")) {
      Node node;
      node.name = n.value("name", std::string());
      node.target = n.at("target").get<std::string>();
      node.inputs = n.at("inputs");
      node.outputs = n.at("outputs");
      if (n.contains("metadata")) node.modules = ModulePaths(n["metadata"]);
      if (IsPipeSplit(node.target)) {
        cuts.push_back(p->nodes.size());
        continue;
      }
      if (OnSizesOnly(node.target, node.outputs)) continue;
      auto op_name = OperatorNameOf(node.target);
      if (!op_name) {
        return Bad(*p, "node '" + node.name + "' calls " + node.target +
                           ", which is not an operator this route runs (higher-order operators and Python "
                           "functions are not)");
      }
      auto found = c10::Dispatcher::singleton().findSchema(*op_name);  // c10::optional in 1.13, std:: in 2.x
      if (found) node.op = *found;
      if (!node.op) {
        return Bad(*p, "node '" + node.name + "' calls " + node.target + " (" + op_name->name +
                           (op_name->overload_name.empty() ? "" : "." + op_name->overload_name) +
                           "), which this LibTorch does not have");
      }
      for (const json& in : node.inputs) CollectReads(in.at("arg"), &node.reads);
      p->nodes.push_back(std::move(node));
    }
    // cut_before: before the first node inside each module named.
    for (const std::string& module : SplitNames(cut_before)) {
      std::size_t at = p->nodes.size();
      for (std::size_t i = 0; i < p->nodes.size() && at == p->nodes.size(); ++i) {
        const auto& m = p->nodes[i].modules;
        if (std::find(m.begin(), m.end(), module) != m.end()) at = i;
      }
      if (at == p->nodes.size()) {
        std::set<std::string> known;
        for (const Node& n : p->nodes)
          for (const std::string& m : n.modules) known.insert(m);
        std::string list;
        for (const std::string& m : known) list += (list.empty() ? "" : ", ") + m;
        return Bad(*p, "cut_before: no module '" + module + "' in the program (its modules: " + list + ")");
      }
      cuts.push_back(at);
    }
  } catch (const json::exception& e) {
    return Bad(*p, std::string("the program's graph is not as torch.export.save writes it: ") + WithoutBacktrace(e));
  }
  // Layers: from each cut to the next (empty ones dropped).
  std::set<std::size_t> bounds(cuts.begin(), cuts.end());
  bounds.insert(0);
  bounds.erase(p->nodes.size());
  p->starts.assign(bounds.begin(), bounds.end());
  if (p->starts.empty()) p->starts.push_back(0);
  const std::size_t layers = p->starts.size();
  auto layer_of = [&](std::size_t node) {
    return static_cast<std::size_t>(std::upper_bound(p->starts.begin(), p->starts.end(), node) - p->starts.begin() - 1);
  };
  // Where each value is made and last read.
  std::map<std::string, std::size_t> made, last_read;
  for (std::size_t i = 0; i < p->nodes.size(); ++i) {
    for (const std::string& r : p->nodes[i].reads) last_read[r] = i;
    std::vector<std::string> outs;
    for (const json& o : p->nodes[i].outputs) CollectReads(o, &outs);
    for (const std::string& o : outs) made[o] = i;
  }
  for (const std::string& o : p->user_outputs) last_read[o] = p->nodes.size();
  // The state each layer uses; one used by several layers is held by the
  // first, and a partition must hold every user (LoadExportedPartition).
  p->layer_state.assign(layers, {});
  std::map<std::string, std::size_t> owner;
  for (std::size_t i = 0; i < p->nodes.size(); ++i) {
    for (const std::string& r : p->nodes[i].reads) {
      auto s = p->state_of.find(r);
      if (s == p->state_of.end()) continue;
      const std::size_t layer = layer_of(i);
      auto [it, first] = owner.emplace(s->second, layer);
      if (!first && it->second != layer) {
        auto [span, added] = p->tied.emplace(s->second, std::make_pair(it->second, layer));
        if (!added) span->second.second = std::max(span->second.second, layer);
      }
    }
  }
  for (const std::string& name : p->state_order) {
    auto it = owner.find(name);
    p->layer_state[it == owner.end() ? 0 : it->second].push_back(name);
  }
  // What crosses into each layer: values made before it (or the user's inputs)
  // and read at or after it, in the order they are made.
  p->crossing.assign(layers, {});
  p->crossing[0] = p->user_inputs;
  std::vector<std::pair<std::size_t, std::string>> values;  // (made at, name)
  for (const std::string& u : p->user_inputs) values.emplace_back(0, u);
  for (const auto& [name, at] : made) values.emplace_back(at + 1, name);
  std::stable_sort(values.begin(), values.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  // Those that do not depend on the batch are made again after the cut, by
  // the nodes that made them and those before them (all batch-free).
  std::set<std::string> batch_free;
  try {
    batch_free = MarkBatchFree(*p);
  } catch (const json::exception& e) {
    return Bad(*p, std::string("the program's graph is not as torch.export.save writes it: ") + WithoutBacktrace(e));
  }
  p->replay.assign(layers, {});
  p->replay_state.assign(layers, {});
  for (std::size_t k = 1; k < layers; ++k) {
    const std::size_t start = p->starts[k];
    std::set<std::size_t> replay;
    std::vector<std::string> wanted;
    for (const auto& [at, name] : values) {
      auto r = last_read.find(name);
      if (!(at <= start && r != last_read.end() && r->second >= start && !p->state_of.count(name))) continue;
      if (batch_free.count(name) && made.count(name)) {
        wanted.push_back(name);
      } else {
        p->crossing[k].push_back(name);
      }
    }
    std::set<std::string> state;
    while (!wanted.empty()) {
      const std::string name = wanted.back();
      wanted.pop_back();
      auto s = p->state_of.find(name);
      if (s != p->state_of.end()) {
        state.insert(s->second);
        continue;
      }
      const std::size_t node = made.at(name);
      if (!replay.insert(node).second) continue;
      wanted.insert(wanted.end(), p->nodes[node].reads.begin(), p->nodes[node].reads.end());
    }
    p->replay[k].assign(replay.begin(), replay.end());
    for (const std::string& name : p->state_order)
      if (state.count(name)) p->replay_state[k].push_back(name);
  }
  try {
    BindSymbols(*p, tensor_values);
  } catch (const json::exception& e) {
    return Bad(*p, std::string("the program's tensor_values are not as torch.export.save writes them: ") +
                       WithoutBacktrace(e));
  }
  try {
    CONVEYOR_RETURN_IF_ERROR(Compile(*p));
  } catch (const json::exception& e) {
    return Bad(*p, std::string("an argument of the program's graph is not as torch.export.save writes it: ") +
                       WithoutBacktrace(e));
  }
  return std::shared_ptr<const Program>(std::move(p));
}

// A float of the graph: a number, or the string JSON needs for the values it
// lacks ("-Infinity" for masked_fill's float("-inf"), as PyTorch 2.11 writes it).
double FloatOf(const json& v) {
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (s == "Infinity" || s == "inf") return std::numeric_limits<double>::infinity();
    if (s == "-Infinity" || s == "-inf") return -std::numeric_limits<double>::infinity();
    if (s == "NaN" || s == "nan") return std::numeric_limits<double>::quiet_NaN();
  }
  return v.get<double>();  // anything else: json's type error, named by the caller
}

// The plan of one argument given in the graph, for a schema argument of type `type`.
StatusOr<ArgPlan> PlanArg(const Program& p, const Node& node, const json& arg, const c10::TypePtr& type) {
  auto slot = [&](const json& t) -> StatusOr<int> {
    const std::string name = t.at("name").get<std::string>();
    auto it = p.slot_of.find(name);
    if (it == p.slot_of.end()) return Bad(p, "node '" + node.name + "' reads '" + name + "', which no node makes");
    return it->second;
  };
  ArgPlan a;
  const auto& [kind, v] = *arg.items().begin();
  if (kind == "as_tensor") {
    a.kind = ArgPlan::kTensor;
    CONVEYOR_ASSIGN_OR_RETURN(int s, slot(v));
    a.slots.push_back(s);
    return a;
  }
  if (kind == "as_tensors" || kind == "as_optional_tensors") {
    a.kind = kind == "as_tensors" ? ArgPlan::kTensorList : ArgPlan::kOptionalTensorList;
    for (const json& t : v) {
      if (kind == "as_tensors" || t.contains("as_tensor")) {
        CONVEYOR_ASSIGN_OR_RETURN(int s, slot(kind == "as_tensors" ? t : t["as_tensor"]));
        a.slots.push_back(s);
      } else {
        a.slots.push_back(-1);
      }
    }
    return a;
  }
  // A size the program computes (dynamic shapes), or a list with some.
  const bool named_sizes = kind == "as_sym_ints" && std::any_of(v.begin(), v.end(), [](const json& i) {
    return i.contains("as_name");
  });
  if ((kind == "as_sym_int" && v.contains("as_name")) || named_sizes) {
    auto size = [&](const json& i) -> StatusOr<SymExpr> {
      if (i.contains("as_int")) return SymExpr::Parse(std::to_string(i["as_int"].get<int64_t>()));
      const std::string name = i.at("as_name").get<std::string>();
      auto it = p.sym_values.find(name);
      if (it == p.sym_values.end())
        return Bad(p, "node '" + node.name + "' takes the size '" + name + "', which the program does not define");
      return it->second;
    };
    a.kind = named_sizes ? ArgPlan::kSymInts : ArgPlan::kSymInt;
    for (const json& i : named_sizes ? v : json::array({v})) {
      CONVEYOR_ASSIGN_OR_RETURN(SymExpr e, size(i));
      a.sizes.push_back(std::move(e));
    }
    a.as_tensor = type->kind() == c10::TypeKind::TensorType;
    return a;
  }
  if ((kind == "as_sym_float" || kind == "as_sym_bool") && v.contains("as_name")) {
    return Bad(p, "node '" + node.name + "' (" + node.target + ") takes a symbolic " +
                      (kind == "as_sym_float" ? "float" : "bool") + ", which this route does not run");
  }
  c10::IValue& c = a.constant;
  if (kind == "as_none") {
    c = c10::IValue();
  } else if (kind == "as_int") {
    c = c10::IValue(v.get<int64_t>());
  } else if (kind == "as_float") {
    c = c10::IValue(FloatOf(v));
  } else if (kind == "as_bool") {
    c = c10::IValue(v.get<bool>());
  } else if (kind == "as_string") {
    c = c10::IValue(v.get<std::string>());
  } else if (kind == "as_ints") {
    c = c10::IValue(v.get<std::vector<int64_t>>());
  } else if (kind == "as_floats") {
    std::vector<double> floats;
    for (const json& f : v) floats.push_back(FloatOf(f));
    c = c10::IValue(floats);
  } else if (kind == "as_bools") {
    c10::List<bool> list;
    for (const json& b : v) list.push_back(b.get<bool>());
    c = c10::IValue(list);
  } else if (kind == "as_sym_int" && v.contains("as_int")) {
    c = c10::IValue(v["as_int"].get<int64_t>());
  } else if (kind == "as_sym_ints") {
    std::vector<int64_t> ints;
    for (const json& i : v) {
      if (!i.contains("as_int")) return Bad(p, "node '" + node.name + "' takes a symbolic size (dynamic shapes)");
      ints.push_back(i["as_int"].get<int64_t>());
    }
    c = c10::IValue(ints);
  } else if (kind == "as_scalar_type") {
    auto t = ScalarTypeOf(v.get<int>());
    if (!t) return Bad(p, "node '" + node.name + "' names dtype code " + v.dump());
    c = c10::IValue(static_cast<int64_t>(*t));
  } else if (kind == "as_device") {
    // The device the program was exported on (`torch.arange(T, device=x.device)` is written
    // as "cpu" when exported on the CPU): a tensor it makes goes to the stage's device, as
    // torch.export's move_to_device_pass moves every device of a program.
    if (!v.is_object() || !v.contains("type") || !v["type"].is_string())
      return Bad(p, "node '" + node.name + "' names the device " + v.dump());
    a.kind = ArgPlan::kDevice;
    return a;
  } else {
    return Bad(p, "node '" + node.name + "' (" + node.target + ") has an argument of kind " + kind +
                      ", which this route does not run");
  }
  // A number where the operator takes a tensor (`x.add_(1)`): a 0-d tensor
  // marked as a wrapped number, as Python passes it (it does not promote the
  // other operand's dtype).
  if ((c.isInt() || c.isDouble() || c.isBool()) && type->kind() == c10::TypeKind::TensorType) {
    at::Tensor t = at::scalar_to_tensor(c.toScalar());
    t.unsafeGetTensorImpl()->set_wrapped_number(true);
    c = c10::IValue(t);
  }
  return a;
}

// Every value's slot, and each node's arguments and returns resolved against
// its operator's schema: what a forward then does is index and call.
Status Compile(Program& p) {
  auto add = [&](const std::string& name) { p.slot_of.emplace(name, static_cast<int>(p.slot_of.size())); };
  for (const std::string& u : p.user_inputs) add(u);
  for (const auto& [placeholder, name] : p.state_of) add(placeholder);
  for (const Node& n : p.nodes) {
    std::vector<std::string> outs;
    for (const json& o : n.outputs) CollectReads(o, &outs);
    for (const std::string& o : outs) add(o);
  }
  for (const auto& [placeholder, name] : p.state_of) p.state_slots.emplace_back(p.slot_of.at(placeholder), name);
  for (const auto& names : p.crossing) {
    std::vector<int> slots;
    for (const std::string& n : names) slots.push_back(p.slot_of.at(n));
    p.crossing_slots.push_back(std::move(slots));
  }
  for (const std::string& n : p.user_outputs) {
    auto it = p.slot_of.find(n);
    if (it == p.slot_of.end()) return Bad(p, "the program returns '" + n + "', which no node makes");
    p.user_output_slots.push_back(it->second);
  }
  p.layer_symbols.assign(p.starts.size(), {});
  for (std::size_t i = 0; i < p.nodes.size(); ++i) {
    Node& node = p.nodes[i];
    const std::size_t layer =
        static_cast<std::size_t>(std::upper_bound(p.starts.begin(), p.starts.end(), i) - p.starts.begin() - 1);
    const c10::FunctionSchema& schema = node.op->schema();
    const std::string& op = schema.name();
    std::map<std::string, const json*> given;
    for (const json& in : node.inputs) given[in.at("name").get<std::string>()] = &in.at("arg");
    for (const c10::Argument& a : schema.arguments()) {
      // The mode the program was exported in gives way to the partition's.
      if ((op == "aten::batch_norm" && a.name() == "training") || (op == "aten::dropout" && a.name() == "train")) {
        ArgPlan flag;
        flag.kind = ArgPlan::kTrainingFlag;
        node.args.push_back(flag);
        continue;
      }
      auto it = given.find(a.name());
      if (it != given.end()) {
        CONVEYOR_ASSIGN_OR_RETURN(ArgPlan plan, PlanArg(p, node, *it->second, a.type()));
        for (const SymExpr& e : plan.sizes) e.Symbols(&p.layer_symbols[layer]);
        node.args.push_back(std::move(plan));
      } else if (a.default_value()) {
        ArgPlan plan;
        plan.constant = *a.default_value();
        node.args.push_back(std::move(plan));
      } else {
        return Bad(p, "node '" + node.name + "' (" + node.target + ") lacks its argument '" + a.name() + "'");
      }
    }
    for (const json& o : node.outputs) {
      std::vector<std::string> names;
      CollectReads(o, &names);
      std::vector<int> slots;
      for (const std::string& n : names) slots.push_back(p.slot_of.at(n));
      node.outs.push_back(std::move(slots));
    }
    if (op == "aten::add_" && given.count("self") && given["self"]->contains("as_tensor")) {
      auto s = p.state_of.find((*given["self"])["as_tensor"]["name"].get<std::string>());
      const std::string suffix = "num_batches_tracked";
      if (s != p.state_of.end() && s->second.size() >= suffix.size() &&
          s->second.compare(s->second.size() - suffix.size(), suffix.size(), suffix) == 0)
        node.counts_batches = p.slot_of.at(s->first);
    }
  }
  FoldHeadSplits(p);
  return absl::OkStatus();
}

// The ints a list argument holds, its sizes evaluated on `symbols` (a size
// whose symbol is not among them counts as -1); nothing for other arguments.
std::optional<std::vector<int64_t>> IntsOf(const ArgPlan& a, const std::map<std::string, int64_t>& symbols = {}) {
  if (a.kind == ArgPlan::kConstant && a.constant.isIntList()) return a.constant.toIntVector();
  if (a.kind != ArgPlan::kSymInts) return std::nullopt;
  std::vector<int64_t> out;
  for (const SymExpr& e : a.sizes) {
    auto v = e.Eval(symbols);
    out.push_back(v.ok() ? *v : -1);
  }
  return out;
}

// nanoGPT's attention, and the zoo's gpt, split the qkv projection as
// `qkv.view(B, T, 3, heads, D).permute(2, 0, 3, 1, 4).unbind(0)`, which
// torch.export writes as those three nodes. Where the view and the permute
// feed nothing else and the three are in one layer, the unbind runs all
// three as SplitHeads (model/split_heads.h), whose backward writes q's, k's
// and v's gradients once into the projection's layout (unbind's stacks them
// and the view's copies the stack: 9 ms of copies a W2 step at batch 8,
// bench/RESULTS.md, issue 19). The same numbers; `model.fused: false` runs
// the three nodes as they are.
void FoldHeadSplits(Program& p) {
  std::map<int, int> readers;  // slot -> how many arguments and outputs read it
  for (const Node& n : p.nodes)
    for (const ArgPlan& a : n.args)
      for (int slot : a.slots) ++readers[slot];
  for (int slot : p.user_output_slots) ++readers[slot];
  for (const auto& slots : p.crossing_slots)
    for (int slot : slots) ++readers[slot];
  std::map<int, std::size_t> maker;  // slot -> the node that writes it
  for (std::size_t i = 0; i < p.nodes.size(); ++i)
    for (const std::vector<int>& out : p.nodes[i].outs)
      for (int slot : out) maker[slot] = i;
  auto layer_of = [&](std::size_t i) { return std::upper_bound(p.starts.begin(), p.starts.end(), i) - p.starts.begin(); };
  // The node that makes `arg`'s tensor when it is `op` and read only there.
  auto sole_maker = [&](const ArgPlan& arg, const char* op) -> Node* {
    if (arg.kind != ArgPlan::kTensor || readers[arg.slots[0]] != 1) return nullptr;
    auto it = maker.find(arg.slots[0]);
    if (it == maker.end()) return nullptr;
    Node& n = p.nodes[it->second];
    return n.op && n.op->schema().name() == op && n.outs.size() == 1 && n.outs[0].size() == 1 ? &n : nullptr;
  };
  for (std::size_t i = 0; i < p.nodes.size(); ++i) {
    Node& unbind = p.nodes[i];
    if (!unbind.op || unbind.op->schema().name() != "aten::unbind" || unbind.args.size() != 2 ||
        unbind.outs.size() != 1 || unbind.outs[0].size() != 3)
      continue;
    const ArgPlan& dim = unbind.args[1];
    if (dim.kind != ArgPlan::kConstant || !dim.constant.isInt() || dim.constant.toInt() != 0) continue;
    Node* permute = sole_maker(unbind.args[0], "aten::permute");
    if (!permute || permute->args.size() != 2 || IntsOf(permute->args[1]) != std::vector<int64_t>{2, 0, 3, 1, 4})
      continue;
    Node* view = sole_maker(permute->args[0], "aten::view");
    if (!view || view->args.size() != 2 || view->args[0].kind != ArgPlan::kTensor) continue;
    const auto size = IntsOf(view->args[1]);
    if (!size || size->size() != 5 || (*size)[2] != 3 || (*size)[3] <= 0) continue;
    const std::size_t v = static_cast<std::size_t>(view - p.nodes.data());
    const std::size_t m = static_cast<std::size_t>(permute - p.nodes.data());
    if (layer_of(v) != layer_of(i) || layer_of(m) != layer_of(i)) continue;
    unbind.split = Node::HeadSplit{(*size)[3], view->args[0].slots[0], v, m};
    view->folded = permute->folded = true;
  }
}

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

  // One node through the operator dispatcher.
  Status Call(const Node& node, std::vector<at::Tensor>& values, const std::map<std::string, int64_t>& symbols) {
    if (!training_ && node.counts_batches >= 0) {  // evaluation does not count batches
      for (const std::vector<int>& o : node.outs)
        if (o.size() == 1) values[static_cast<std::size_t>(o[0])] = values[static_cast<std::size_t>(node.counts_batches)];
      return absl::OkStatus();
    }
    torch::jit::Stack stack;
    stack.reserve(node.args.size());
    for (const ArgPlan& a : node.args) {
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
    }
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

StatusOr<ExportedSummary> DescribeExportedProgram(const std::string& path, const std::string& cut_before) {
  CONVEYOR_ASSIGN_OR_RETURN(std::shared_ptr<const Program> p, ReadProgram(path, cut_before));
  ExportedSummary s;
  std::set<std::string> ops;
  for (const Node& n : p->nodes) ops.insert(n.target);
  s.operators.assign(ops.begin(), ops.end());
  for (const Node& n : p->nodes)
    if (n.split) s.head_splits.push_back(n.name);
  for (std::size_t k = 0; k < p->starts.size(); ++k) {
    const std::size_t first = p->starts[k];
    const Node* node = first < p->nodes.size() ? &p->nodes[first] : nullptr;
    s.layer_names.push_back(node && !node->modules.empty() ? node->modules.back() : node ? node->name : "");
    int64_t elements = 0;
    for (const std::string& name : p->layer_state[k])
      if (p->parameters.count(name)) elements += p->numel.at(name);
    s.layer_parameters.push_back(elements);
  }
  return s;
}

StatusOr<std::unique_ptr<Partition>> LoadExportedPartition(const std::string& path, const std::string& cut_before,
                                                           int begin, int end, bool fuse) {
  CONVEYOR_ASSIGN_OR_RETURN(std::shared_ptr<const Program> p, ReadProgram(path, cut_before));
  const int layers = static_cast<int>(p->starts.size());
  if (begin < 0 || end > layers || begin >= end) {
    return absl::InvalidArgumentError("model.exported: layers [" + std::to_string(begin) + ", " +
                                      std::to_string(end) + ") of a program of " + std::to_string(layers) + " layers");
  }
  std::set<std::string> copied(p->replay_state[static_cast<std::size_t>(begin)].begin(),
                               p->replay_state[static_cast<std::size_t>(begin)].end());
  for (const auto& [name, span] : p->tied) {
    const auto [first, last] = span;
    const bool some = static_cast<int>(last) >= begin && static_cast<int>(first) < end;
    // A buffer no node writes, used on both sides of the stage's first cut:
    // a copy here (an earlier stage holds it as state).
    const bool read_only = !p->parameters.count(name) && !p->written.count(name);
    if (some && read_only && static_cast<int>(first) < begin) {
      copied.insert(name);
      continue;
    }
    if (some && !read_only && (static_cast<int>(first) < begin || static_cast<int>(last) >= end)) {
      return Bad(*p, "'" + name + "' is used by layers " + std::to_string(first) + " to " + std::to_string(last) +
                         ", and a stage holds layers [" + std::to_string(begin) + ", " + std::to_string(end) +
                         "): a " + (p->parameters.count(name) ? "parameter" : "buffer") +
                         " tied across a stage boundary; cut elsewhere, or keep those layers on one stage");
    }
  }
  // Dynamic shapes: every size the stage's layers take comes from a symbol
  // that the tensors entering its first layer carry.
  std::set<std::string> bound;
  for (const SymBinding& b : p->bindings[static_cast<std::size_t>(begin)]) bound.insert(b.symbol);
  std::set<std::string> replayed;  // the sizes of the nodes made again at `begin`
  for (std::size_t i : p->replay[static_cast<std::size_t>(begin)])
    for (const ArgPlan& a : p->nodes[i].args)
      for (const SymExpr& e : a.sizes) e.Symbols(&replayed);
  for (int k = begin; k < end; ++k) {
    std::set<std::string> symbols = p->layer_symbols[static_cast<std::size_t>(k)];
    if (k == begin) symbols.insert(replayed.begin(), replayed.end());
    for (const std::string& symbol : symbols) {
      if (bound.count(symbol)) continue;
      return Bad(*p, "layer " + std::to_string(k) + " takes sizes computed from the symbol " + symbol +
                         ", and no tensor entering layer " + std::to_string(begin) +
                         " (this stage's first) has it as a dimension: a size that comes from the data "
                         "(.item(), nonzero) or from a tensor that does not cross into the stage is not run");
    }
  }
  std::map<std::string, at::Tensor> held, copies;
  try {
    for (int k = begin; k < end; ++k) {
      for (const std::string& name : p->layer_state[static_cast<std::size_t>(k)]) {
        CONVEYOR_ASSIGN_OR_RETURN(held[name], ReadWeight(*p, name));
      }
    }
    for (const std::string& name : copied) {
      CONVEYOR_ASSIGN_OR_RETURN(copies[name], ReadWeight(*p, name));
    }
  } catch (const std::exception& e) {  // a damaged archive
    return Bad(*p, std::string("reading its weights: ") + WithoutBacktrace(e));
  }
  return std::unique_ptr<Partition>(
      new ExportedPartition(std::move(p), begin, end, std::move(held), std::move(copies), fuse));
}

}  // namespace conveyor
