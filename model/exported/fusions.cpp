// Fusions (model/exported/program.h): patterns of nodes that run as one
// operation of our own, with the same numbers and a cheaper backward.
// `model.fused: false` runs the nodes as they are.
#include "model/exported/program.h"

namespace conveyor::exported {

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
    if (LayerOf(p, v) != LayerOf(p, i) || LayerOf(p, m) != LayerOf(p, i)) continue;
    unbind.split = Node::HeadSplit{(*size)[3], view->args[0].slots[0], v, m};
    view->folded = permute->folded = true;
  }
}

}  // namespace conveyor::exported
