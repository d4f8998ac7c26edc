// Dynamic shapes (model/exported_program.h): sizes the graph computes from a
// symbol (a batch dimension exported as "s0") are not run as nodes but
// evaluated from their expressions (model/sym_expr.h) on the symbols that
// the tensors entering a partition carry as dimensions, so that no integer
// crosses a cut.
#include "model/exported/program.h"

namespace conveyor::exported {
namespace {

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
    text = std::to_string(v.at("as_int").get<int64_t>());
  } else if (v.contains("as_expr")) {
    text = ExprText(v.at("as_expr"));
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

}  // namespace

Status ReadSymValues(Program& p, const json& graph) {
  if (!graph.contains("sym_int_values")) return absl::OkStatus();
  for (const auto& [name, v] : graph.at("sym_int_values").items()) {
    CONVEYOR_ASSIGN_OR_RETURN(SymExpr e, SymValueOf(p, name, v));
    p.sym_values.emplace(name, std::move(e));
  }
  return absl::OkStatus();
}

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
      const json& meta = tv->contains("meta") ? (*tv).at("meta") : *tv;  // TensorValue{meta} in older archives
      if (!meta.contains("sizes")) continue;
      int64_t d = 0;
      for (const json& size : meta.at("sizes")) {
        if (size.contains("as_expr")) {
          const std::string symbol = SymbolOf(ExprText(size.at("as_expr")));
          if (!symbol.empty() && bound.insert(symbol).second) p.bindings[k].push_back({i, d, symbol});
        }
        ++d;
      }
    }
  }
}

Status CheckSymbolsBound(const Program& p, int begin, int end) {
  std::set<std::string> bound;
  for (const SymBinding& b : p.bindings[static_cast<std::size_t>(begin)]) bound.insert(b.symbol);
  std::set<std::string> replayed;  // the sizes of the nodes made again at `begin`
  for (std::size_t i : p.replay[static_cast<std::size_t>(begin)])
    for (const ArgPlan& a : p.nodes[i].args)
      for (const SymExpr& e : a.sizes) e.Symbols(&replayed);
  for (int k = begin; k < end; ++k) {
    std::set<std::string> symbols = p.layer_symbols[static_cast<std::size_t>(k)];
    if (k == begin) symbols.insert(replayed.begin(), replayed.end());
    for (const std::string& symbol : symbols) {
      if (bound.count(symbol)) continue;
      return Bad(p, "layer " + std::to_string(k) + " takes sizes computed from the symbol " + symbol +
                        ", and no tensor entering layer " + std::to_string(begin) +
                        " (this stage's first) has it as a dimension: a size that comes from the data "
                        "(.item(), nonzero) or from a tensor that does not cross into the stage is not run");
    }
  }
  return absl::OkStatus();
}

}  // namespace conveyor::exported
