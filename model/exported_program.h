// Models from PyTorch 2: a program saved by torch.export.save (the `.pt2`
// archive of an ExportedProgram, training IR), trained in C++ without Python.
//
// The route (docs/architecture.md, "Exported programs"): the program's graph
// is interpreted node by node through LibTorch's operator dispatcher, each
// node's operator found by name (`torch.ops.aten.conv2d.default` is
// `aten::conv2d`) and called with its arguments boxed, so that autograd
// records it as it records any eager call: backward, the optimizers, the
// schedules, checkpoints and recovery are the stage's own. An operator this
// LibTorch does not have is an error naming it when the program is read (a
// job is refused when it is described, before it is placed).
//
// Layers: the program is cut into layers at the cut points the user marked in
// Python (torch.distributed.pipelining's `pipe_split()`, a
// `pippy._pipe_split` node) and before the first node of each module named
// in `cut_before` (module paths as the program's nn_module_stack names them,
// "fc" or "blocks.3"); a job's partition then places whole layers, as for a
// TorchScript nn.Sequential's children. What crosses a cut is every tensor
// computed before it and used after it, in the order of its first use.
//
// Parameters and buffers are the program's state, named as the module's
// state_dict() names them ("conv.weight"), so that init_from, save and
// export read and write the user's own names. A parameter used on both sides
// of a cut (tied weights) is refused naming it; a buffer that no node writes
// is copied to the later stages that read it.
//
// Dynamic shapes (a batch dimension exported as a symbol): sizes the graph
// computes from it are not run as nodes but evaluated from their expressions
// (model/sym_expr.h) on the symbols that the tensors entering the partition
// carry as dimensions, so no integer crosses a cut. Likewise a value that
// does not depend on the batch (sliced from a buffer, an arange) is made again
// after a cut from copies of the buffers it reads, not sent.
//
// Training IR records the mode it was exported in: BatchNorm's `training`
// and dropout's `train` arguments follow the partition's Train() instead, and
// a BatchNorm's num_batches_tracked is not counted in evaluation, as the
// nn.Module would do.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/partition.h"

namespace conveyor {

// What the coordinator needs to know of a program before it places a job.
struct ExportedSummary {
  std::vector<std::string> layer_names;   // "layer 0", ..., each with the first module it holds
  std::vector<int64_t> layer_parameters;  // elements per layer
  std::vector<std::string> operators;     // the distinct operators the graph calls
  // The unbind nodes that split attention's q, k and v from the qkv
  // projection with its view and permute, run as one (model.fused).
  std::vector<std::string> head_splits;
};

// NOT_FOUND for a missing file; INVALID_ARGUMENT for a file that is not an
// exported program, a graph this route cannot run (naming the node and its
// operator), a `cut_before` module the program does not have, or a parameter
// used across a cut. `cut_before`: module paths separated by commas.
StatusOr<ExportedSummary> DescribeExportedProgram(const std::string& path, const std::string& cut_before);

// Layers [begin, end) of the program at `path`, on the CPU, their parameters
// and buffers loaded from the archive.
StatusOr<std::unique_ptr<Partition>> LoadExportedPartition(const std::string& path, const std::string& cut_before,
                                                           int begin, int end, bool fuse = true);

}  // namespace conveyor
