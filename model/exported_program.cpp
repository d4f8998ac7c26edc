// The exported-program route's entry points (model/exported_program.h); its
// parts are in model/exported/ (program.h says which file holds which).
#include "model/exported_program.h"

#include <map>
#include <set>

#include "model/exported/program.h"

namespace conveyor {
namespace {

using exported::Bad;
using exported::Node;
using exported::Program;

// INVALID_ARGUMENT for state used on both sides of the stage's cuts, unless
// it is a buffer no node writes used by earlier layers too: those are
// copied here (an earlier stage holds them as state) and returned, with the
// buffers that the nodes replayed at `begin` read.
StatusOr<std::set<std::string>> CheckTiedState(const Program& p, int begin, int end) {
  std::set<std::string> copied(p.replay_state[static_cast<std::size_t>(begin)].begin(),
                               p.replay_state[static_cast<std::size_t>(begin)].end());
  for (const auto& [name, span] : p.tied) {
    const auto [first, last] = span;
    const bool some = static_cast<int>(last) >= begin && static_cast<int>(first) < end;
    // A buffer no node writes, used on both sides of the stage's first cut:
    // a copy here (an earlier stage holds it as state).
    const bool read_only = !p.parameters.count(name) && !p.written.count(name);
    if (some && read_only && static_cast<int>(first) < begin) {
      copied.insert(name);
      continue;
    }
    if (some && !read_only && (static_cast<int>(first) < begin || static_cast<int>(last) >= end)) {
      return Bad(p, "'" + name + "' is used by layers " + std::to_string(first) + " to " + std::to_string(last) +
                        ", and a stage holds layers [" + std::to_string(begin) + ", " + std::to_string(end) +
                        "): a " + (p.parameters.count(name) ? "parameter" : "buffer") +
                        " tied across a stage boundary; cut elsewhere, or keep those layers on one stage");
    }
  }
  return copied;
}

// The state of layers [begin, end) into `held`, the buffers `copied` into
// `copies`, read from the archive.
Status ReadState(const Program& p, int begin, int end, const std::set<std::string>& copied,
                 std::map<std::string, at::Tensor>* held, std::map<std::string, at::Tensor>* copies) {
  try {
    for (int k = begin; k < end; ++k) {
      for (const std::string& name : p.layer_state[static_cast<std::size_t>(k)]) {
        CONVEYOR_ASSIGN_OR_RETURN((*held)[name], exported::ReadWeight(p, name));
      }
    }
    for (const std::string& name : copied) {
      CONVEYOR_ASSIGN_OR_RETURN((*copies)[name], exported::ReadWeight(p, name));
    }
  } catch (const std::exception& e) {  // a damaged archive
    return Bad(p, std::string("reading its weights: ") + exported::WithoutBacktrace(e));
  }
  return absl::OkStatus();
}

}  // namespace

StatusOr<ExportedSummary> DescribeExportedProgram(const std::string& path, const std::string& cut_before) {
  CONVEYOR_ASSIGN_OR_RETURN(std::shared_ptr<const Program> p, exported::ReadProgram(path, cut_before));
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
  CONVEYOR_ASSIGN_OR_RETURN(std::shared_ptr<const Program> p, exported::ReadProgram(path, cut_before));
  const int layers = static_cast<int>(p->starts.size());
  if (begin < 0 || end > layers || begin >= end) {
    return absl::InvalidArgumentError("model.exported: layers [" + std::to_string(begin) + ", " +
                                      std::to_string(end) + ") of a program of " + std::to_string(layers) + " layers");
  }
  CONVEYOR_ASSIGN_OR_RETURN(std::set<std::string> copied, CheckTiedState(*p, begin, end));
  // Dynamic shapes: every size the stage's layers take comes from a symbol
  // that the tensors entering its first layer carry.
  CONVEYOR_RETURN_IF_ERROR(exported::CheckSymbolsBound(*p, begin, end));
  std::map<std::string, at::Tensor> held, copies;
  CONVEYOR_RETURN_IF_ERROR(ReadState(*p, begin, end, copied, &held, &copies));
  return exported::MakeExportedPartition(std::move(p), begin, end, std::move(held), std::move(copies), fuse);
}

}  // namespace conveyor
