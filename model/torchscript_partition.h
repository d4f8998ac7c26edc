// Models from PyTorch: a TorchScript archive of an nn.Sequential, written in
// Python by torch.jit.script(model).save(PATH) (or torch.jit.trace), cut
// between its top-level children. Its weights are the initial weights.
//
// Stages run TorchScript with the graph executor's optimisation off: its
// specialisation changes kernels after the first runs (and would fight CUDA
// graphs); docs/models.md says so.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/partition.h"

namespace conveyor {

// What the coordinator needs to know of an archive before it places a job.
struct TorchScriptSummary {
  std::vector<std::string> layer_names;     // the top-level children, in order
  std::vector<int64_t> layer_parameters;    // elements per layer
  // Layers whose parameters share storage with another layer's (tied
  // weights): pairs of layer indices.
  std::vector<std::pair<int, int>> tied_layers;
};

// NOT_FOUND for a missing file; INVALID_ARGUMENT for a file that is not
// TorchScript or whose top-level module is not an nn.Sequential.
StatusOr<TorchScriptSummary> DescribeTorchScript(const std::string& path);

// Layers [begin, end) of the archive at `path`, on the CPU. INVALID_ARGUMENT
// for a bad range, and for a layer held here whose parameters are tied to a
// layer outside [begin, end) (two copies would train apart).
StatusOr<std::unique_ptr<Partition>> LoadTorchScriptPartition(const std::string& path, int begin, int end);

}  // namespace conveyor
