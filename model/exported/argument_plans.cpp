// Argument plans (model/exported/program.h): every value of the graph gets a
// slot, and each node's arguments are resolved against its operator's schema
// when the program is read (a constant as the schema takes it, the slots its
// tensors come from, sizes as expressions), so that a forward only indexes
// and calls.
#include <algorithm>
#include <limits>

#include <ATen/ScalarOps.h>

#include "model/exported/program.h"

namespace conveyor::exported {
namespace {

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


// A tensor, or a list of them (optional ones: -1 for None), as slots.
StatusOr<ArgPlan> PlanTensors(const Program& p, const Node& node, const std::string& kind, const json& v) {
  auto slot = [&](const json& t) -> StatusOr<int> {
    const std::string name = t.at("name").get<std::string>();
    auto it = p.slot_of.find(name);
    if (it == p.slot_of.end()) return Bad(p, "node '" + node.name + "' reads '" + name + "', which no node makes");
    return it->second;
  };
  ArgPlan a;
  if (kind == "as_tensor") {
    a.kind = ArgPlan::kTensor;
    CONVEYOR_ASSIGN_OR_RETURN(int s, slot(v));
    a.slots.push_back(s);
    return a;
  }
  a.kind = kind == "as_tensors" ? ArgPlan::kTensorList : ArgPlan::kOptionalTensorList;
  for (const json& t : v) {
    if (kind == "as_tensors" || t.contains("as_tensor")) {
      CONVEYOR_ASSIGN_OR_RETURN(int s, slot(kind == "as_tensors" ? t : t.at("as_tensor")));
      a.slots.push_back(s);
    } else {
      a.slots.push_back(-1);
    }
  }
  return a;
}

// A size the program computes (dynamic shapes), or a list with some
// (`named_sizes`): expressions evaluated on each forward's symbols.
StatusOr<ArgPlan> PlanSizes(const Program& p, const Node& node, const json& v, bool named_sizes,
                            const c10::TypePtr& type) {
  auto size = [&](const json& i) -> StatusOr<SymExpr> {
    if (i.contains("as_int")) return SymExpr::Parse(std::to_string(i.at("as_int").get<int64_t>()));
    const std::string name = i.at("as_name").get<std::string>();
    auto it = p.sym_values.find(name);
    if (it == p.sym_values.end())
      return Bad(p, "node '" + node.name + "' takes the size '" + name + "', which the program does not define");
    return it->second;
  };
  ArgPlan a;
  a.kind = named_sizes ? ArgPlan::kSymInts : ArgPlan::kSymInt;
  for (const json& i : named_sizes ? v : json::array({v})) {
    CONVEYOR_ASSIGN_OR_RETURN(SymExpr e, size(i));
    a.sizes.push_back(std::move(e));
  }
  a.as_tensor = type->kind() == c10::TypeKind::TensorType;
  return a;
}

// A constant of the graph, as the schema's `type` takes it; a device the
// program names is the stage's (ArgPlan::kDevice).
StatusOr<ArgPlan> PlanConstant(const Program& p, const Node& node, const std::string& kind, const json& v,
                               const c10::TypePtr& type) {
  ArgPlan a;
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
    c = c10::IValue(v.at("as_int").get<int64_t>());
  } else if (kind == "as_sym_ints") {
    std::vector<int64_t> ints;
    for (const json& i : v) {
      if (!i.contains("as_int")) return Bad(p, "node '" + node.name + "' takes a symbolic size (dynamic shapes)");
      ints.push_back(i.at("as_int").get<int64_t>());
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
    if (!v.is_object() || !v.contains("type") || !v.at("type").is_string())
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

// The plan of one argument given in the graph, for a schema argument of type `type`.
StatusOr<ArgPlan> PlanArg(const Program& p, const Node& node, const json& arg, const c10::TypePtr& type) {
  if (!arg.is_object() || arg.empty())
    return Bad(p, "node '" + node.name + "' (" + node.target + ") has an argument that is not one {kind: value}");
  // The key and value through the object's own iterator: both refer into
  // `arg`. (items() hands out a proxy that dies with the expression that made
  // it, and a structured binding to it reads a dead stack slot, as
  // AddressSanitizer reported.)
  const json::const_iterator first = arg.begin();
  const std::string& kind = first.key();
  const json& v = first.value();
  if (kind == "as_tensor" || kind == "as_tensors" || kind == "as_optional_tensors")
    return PlanTensors(p, node, kind, v);
  const bool named_sizes = kind == "as_sym_ints" && std::any_of(v.begin(), v.end(), [](const json& i) {
    return i.contains("as_name");
  });
  if ((kind == "as_sym_int" && v.contains("as_name")) || named_sizes) return PlanSizes(p, node, v, named_sizes, type);
  if ((kind == "as_sym_float" || kind == "as_sym_bool") && v.contains("as_name")) {
    return Bad(p, "node '" + node.name + "' (" + node.target + ") takes a symbolic " +
                      (kind == "as_sym_float" ? "float" : "bool") + ", which this route does not run");
  }
  return PlanConstant(p, node, kind, v, type);
}

// Every value's slot: the user's inputs, the state's placeholders, then each
// node's outputs; and the slots of the crossings, the state and the outputs.
Status AssignSlots(Program& p) {
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
  return absl::OkStatus();
}

// Node i's argument plans and return slots; the symbols its sizes read go to
// its layer's (Program::layer_symbols).
Status PlanNode(Program& p, std::size_t i) {
  Node& node = p.nodes[i];
  const std::size_t layer = LayerOf(p, i);
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
    auto s = p.state_of.find((*given["self"]).at("as_tensor").at("name").get<std::string>());
    const std::string suffix = "num_batches_tracked";
    if (s != p.state_of.end() && s->second.size() >= suffix.size() &&
        s->second.compare(s->second.size() - suffix.size(), suffix.size(), suffix) == 0)
      node.counts_batches = p.slot_of.at(s->first);
  }
  return absl::OkStatus();
}

}  // namespace

Status Compile(Program& p) {
  CONVEYOR_RETURN_IF_ERROR(AssignSlots(p));
  p.layer_symbols.assign(p.starts.size(), {});
  for (std::size_t i = 0; i < p.nodes.size(); ++i) CONVEYOR_RETURN_IF_ERROR(PlanNode(p, i));
  FoldHeadSplits(p);
  return absl::OkStatus();
}

std::optional<std::vector<int64_t>> IntsOf(const ArgPlan& a, const std::map<std::string, int64_t>& symbols) {
  if (a.kind == ArgPlan::kConstant && a.constant.isIntList()) return a.constant.toIntVector();
  if (a.kind != ArgPlan::kSymInts) return std::nullopt;
  std::vector<int64_t> out;
  for (const SymExpr& e : a.sizes) {
    auto v = e.Eval(symbols);
    out.push_back(v.ok() ? *v : -1);
  }
  return out;
}

}  // namespace conveyor::exported
