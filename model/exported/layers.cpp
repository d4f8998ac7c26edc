// The cuts made into layers (model/exported/program.h): each layer's nodes
// and state, which state is tied across layers, what crosses into each
// layer, and what a partition that starts at a layer makes again instead.
#include <algorithm>

#include "model/exported/program.h"

namespace conveyor::exported {
namespace {

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


// Where each value is made (the node) and last read (p.nodes.size(): the
// graph returns it). torch.export makes each value once, under a name no
// input or state has; a layer's replay follows a value to its one maker, so
// a graph that makes one twice is refused (found by fuzz_exported_program:
// the replay followed a value to the wrong maker, then to a name nothing made).
Status MadeAndRead(const Program& p, std::map<std::string, std::size_t>* made,
                   std::map<std::string, std::size_t>* last_read) {
  std::set<std::string> placeholders(p.user_inputs.begin(), p.user_inputs.end());
  for (const auto& [placeholder, name] : p.state_of) placeholders.insert(placeholder);
  for (std::size_t i = 0; i < p.nodes.size(); ++i) {
    for (const std::string& r : p.nodes[i].reads) (*last_read)[r] = i;
    std::vector<std::string> outs;
    for (const json& o : p.nodes[i].outputs) CollectReads(o, &outs);
    for (const std::string& o : outs) {
      if (placeholders.count(o)) {
        return Bad(p, "node '" + p.nodes[i].name + "' makes '" + o +
                          "', the name of an input or state of the program: the graph is not as torch.export.save "
                          "writes it");
      }
      auto [at, first] = made->emplace(o, i);
      if (!first) {
        return Bad(p, "'" + o + "' is made twice, by node '" + p.nodes[at->second].name + "' and by node '" +
                          p.nodes[i].name + "': the graph is not as torch.export.save writes it");
      }
    }
  }
  for (const std::string& o : p.user_outputs) (*last_read)[o] = p.nodes.size();
  return absl::OkStatus();
}

// Layer k's crossing values, and the nodes it runs again (with the state
// they read) to make the batch-free ones: those and the nodes before them,
// all batch-free. `values`: (made at, name) in the order they are made.
void CrossInto(Program& p, std::size_t k, const std::vector<std::pair<std::size_t, std::string>>& values,
               const std::map<std::string, std::size_t>& made, const std::map<std::string, std::size_t>& last_read,
               const std::set<std::string>& batch_free) {
  const std::size_t start = p.starts[k];
  std::set<std::size_t> replay;
  std::vector<std::string> wanted;
  for (const auto& [at, name] : values) {
    auto r = last_read.find(name);
    if (!(at <= start && r != last_read.end() && r->second >= start && !p.state_of.count(name))) continue;
    if (batch_free.count(name) && made.count(name)) {
      wanted.push_back(name);
    } else {
      p.crossing[k].push_back(name);
    }
  }
  std::set<std::string> state;
  while (!wanted.empty()) {
    const std::string name = wanted.back();
    wanted.pop_back();
    auto s = p.state_of.find(name);
    if (s != p.state_of.end()) {
      state.insert(s->second);
      continue;
    }
    // A batch-free value's maker reads batch-free values alone: state, or
    // what another node makes (each value once: MadeAndRead).
    const std::size_t node = made.at(name);
    if (!replay.insert(node).second) continue;
    wanted.insert(wanted.end(), p.nodes[node].reads.begin(), p.nodes[node].reads.end());
  }
  p.replay[k].assign(replay.begin(), replay.end());
  for (const std::string& name : p.state_order)
    if (state.count(name)) p.replay_state[k].push_back(name);
}

}  // namespace

void MakeLayers(Program& p, const std::vector<std::size_t>& cuts) {
  // From each cut to the next (empty ones dropped).
  std::set<std::size_t> bounds(cuts.begin(), cuts.end());
  bounds.insert(0);
  bounds.erase(p.nodes.size());
  p.starts.assign(bounds.begin(), bounds.end());
  if (p.starts.empty()) p.starts.push_back(0);
  // The state each layer uses; one used by several layers is held by the
  // first, and a partition must hold every user (LoadExportedPartition).
  p.layer_state.assign(p.starts.size(), {});
  std::map<std::string, std::size_t> owner;
  for (std::size_t i = 0; i < p.nodes.size(); ++i) {
    for (const std::string& r : p.nodes[i].reads) {
      auto s = p.state_of.find(r);
      if (s == p.state_of.end()) continue;
      const std::size_t layer = LayerOf(p, i);
      auto [it, first] = owner.emplace(s->second, layer);
      if (!first && it->second != layer) {
        auto [span, added] = p.tied.emplace(s->second, std::make_pair(it->second, layer));
        if (!added) span->second.second = std::max(span->second.second, layer);
      }
    }
  }
  for (const std::string& name : p.state_order) {
    auto it = owner.find(name);
    p.layer_state[it == owner.end() ? 0 : it->second].push_back(name);
  }
}

Status FindCrossings(Program& p) {
  const std::size_t layers = p.starts.size();
  std::map<std::string, std::size_t> made, last_read;
  CONVEYOR_RETURN_IF_ERROR(MadeAndRead(p, &made, &last_read));
  // What crosses into each layer: values made before it (or the user's inputs)
  // and read at or after it, in the order they are made.
  p.crossing.assign(layers, {});
  p.crossing[0] = p.user_inputs;
  std::vector<std::pair<std::size_t, std::string>> values;  // (made at, name)
  for (const std::string& u : p.user_inputs) values.emplace_back(0, u);
  for (const auto& [name, at] : made) values.emplace_back(at + 1, name);
  std::stable_sort(values.begin(), values.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  // Those that do not depend on the batch are made again after the cut.
  std::set<std::string> batch_free;
  try {
    batch_free = MarkBatchFree(p);
  } catch (const json::exception& e) {
    return Bad(p, std::string("the program's graph is not as torch.export.save writes it: ") + WithoutBacktrace(e));
  }
  p.replay.assign(layers, {});
  p.replay_state.assign(layers, {});
  for (std::size_t k = 1; k < layers; ++k) CrossInto(p, k, values, made, last_read, batch_free);
  return absl::OkStatus();
}

}  // namespace conveyor::exported
