// State dicts and tensor data files as LibTorch tensors, over the torch-free
// reader and writer of torch_format/torch_file.h (what they accept and refuse is
// said there).
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "torch_format/torch_file.h"

namespace conveyor {

struct ReadTensorsOptions {
  // false: the tensors are views of the mapped file (no copy; the mapping
  // lives until the last tensor over it dies; writes to them stay in this
  // process, copy on write). true: each storage is copied into memory of its
  // own and the file is unmapped before the call returns. Storages whose data
  // is not aligned to their element size (never in torch.save's files, which
  // align to 64 bytes) are copied either way.
  bool copy = false;
};

// A state_dict as torch.save wrote it: names and CPU tensors in file order,
// each with the sizes, strides and storage offset it was saved with; tensors
// that shared a storage in the file share memory here. NOT_FOUND for a
// missing file, INVALID_ARGUMENT for one the reader refuses or whose root is
// not a dict of tensors.
StatusOr<std::vector<std::pair<std::string, at::Tensor>>> ReadStateDict(const std::string& path,
                                                                        const ReadTensorsOptions& options = {});

// A data file ({"inputs": X, "targets": Y, ...}; a dict or an OrderedDict of
// tensors), by name.
StatusOr<std::map<std::string, at::Tensor>> ReadTensorDict(const std::string& path,
                                                           const ReadTensorsOptions& options = {});

// Writes an OrderedDict of the tensors that torch.load(path, weights_only=True)
// reads and nn.Module.load_state_dict accepts (PyTorch 1.13 and 2.x). Tensors
// on any device are copied to the CPU, contiguous, first; each gets a storage
// of its own (views are not kept shared). INVALID_ARGUMENT naming the tensor
// for a dtype the format here lacks (complex, quantized) or a non-strided
// layout (sparse). Replaces `path` atomically.
Status WriteStateDict(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors);

// The dtype mapping, both ways (false / nullopt-like for the ones not held).
bool ToScalarType(TorchDType dtype, at::ScalarType* out);
bool FromScalarType(at::ScalarType type, TorchDType* out);

}  // namespace conveyor
