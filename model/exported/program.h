// An exported program as model/exported/ holds it once read (the route is
// described in model/exported_program.h): the graph's nodes, each resolved
// to an operator and to argument plans, the layers the cuts make, what
// crosses each cut, and where the state lies in the archive. Read once per
// Describe or Load, then immutable: partitions share it.
//
// The parts, by file:
//   archive.cpp          the .pt2 archive read (ReadProgram) and its weights (ReadWeight)
//   layers.cpp           the cuts made into layers: each layer's state, what crosses into it,
//                        what is made again after it
//   symbolic_shapes.cpp  dynamic shapes: sizes as expressions over the symbols tensors carry
//   argument_plans.cpp   each call's arguments resolved against its operator's schema (Compile)
//   fusions.cpp          attention's head split run as one (FoldHeadSplits)
//   runtime.cpp          the partition that runs layers [begin, end) (ExportedPartition)
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <caffe2/serialize/inline_container.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "model/partition.h"
#include "model/sym_expr.h"

namespace conveyor::exported {

using json = nlohmann::json;

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

// "model.exported: <path>: <what>", INVALID_ARGUMENT.
Status Bad(const Program& p, const std::string& what);
// LibTorch's message without the C++ stack that c10::Error appends to what().
std::string WithoutBacktrace(const std::exception& e);
// torch/_export/serde/schema.py's ScalarType.
std::optional<at::ScalarType> ScalarTypeOf(int code);
// The names an argument reads (tensors, lists of them).
void CollectReads(const json& arg, std::vector<std::string>* out);
// The layer that node `i` is in.
std::size_t LayerOf(const Program& p, std::size_t i);

// archive.cpp. NOT_FOUND for a missing file; INVALID_ARGUMENT for anything
// in it this route does not read or run.
StatusOr<std::shared_ptr<const Program>> ReadProgram(const std::string& path, const std::string& cut_before);
// State tensor `name`, read from the archive onto the CPU.
StatusOr<at::Tensor> ReadWeight(const Program& p, const std::string& name);

// layers.cpp. Layers from each cut (node indices) to the next, and the state
// each layer holds (Program::starts, layer_state, tied).
void MakeLayers(Program& p, const std::vector<std::size_t>& cuts);
// What crosses into each layer and what is made again after it
// (Program::crossing, replay, replay_state, written).
Status FindCrossings(Program& p);

// symbolic_shapes.cpp.
// graph.sym_int_values into Program::sym_values.
Status ReadSymValues(Program& p, const json& graph);
// Whether a node only computes or checks sizes (not run: its sizes are
// evaluated from their expressions where an operator takes them).
bool OnSizesOnly(const std::string& target, const json& outputs);
// Program::bindings from the graph's tensor_values.
void BindSymbols(Program& p, const json& tensor_values);
// INVALID_ARGUMENT unless every size layers [begin, end) take comes from a
// symbol that the tensors entering layer `begin` carry.
Status CheckSymbolsBound(const Program& p, int begin, int end);

// argument_plans.cpp. Every value's slot, and each node's arguments and
// returns resolved against its operator's schema; then FoldHeadSplits.
Status Compile(Program& p);
// The ints a list argument holds, its sizes evaluated on `symbols` (a size
// whose symbol is not among them counts as -1); nothing for other arguments.
std::optional<std::vector<int64_t>> IntsOf(const ArgPlan& a, const std::map<std::string, int64_t>& symbols = {});

// fusions.cpp.
void FoldHeadSplits(Program& p);

// runtime.cpp. Layers [begin, end) of `program`; `held`: the state of those
// layers; `copies`: the buffers that the nodes replayed at `begin` read (held
// by an earlier stage, copied here); `fuse`: head splits run as one.
std::unique_ptr<Partition> MakeExportedPartition(std::shared_ptr<const Program> program, int begin, int end,
                                                 std::map<std::string, at::Tensor> held,
                                                 std::map<std::string, at::Tensor> copies, bool fuse);

}  // namespace conveyor::exported
