// Tensors rebound as views of one flat tensor per (dtype, device), holding
// their values and their strides: a collective on the flats is one call per
// group, in place, with no copy in or out and no staging memory. Replicas
// broadcast BatchNorm's statistics this way after each step. (ZeRO-1 lays the
// parameters out as the gradients' buckets instead: GradientReducer::
// SliceParameters.)
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace conveyor {

// The indices of `tensors` by (dtype, device): the groups that each have a
// flat buffer of their own (here and in ReplicaGroup's collectives).
std::map<std::pair<int, std::string>, std::vector<std::size_t>> ByDtypeAndDevice(const std::vector<at::Tensor>& tensors);

class FlatViews {
 public:
  FlatViews() = default;

  // Rebinds each of `tensors` (the module's own handles: the module sees the
  // move) to a view of a new flat tensor of its group, its values copied
  // there. A dense tensor keeps its strides (channels_last stays
  // channels_last); any other becomes contiguous. Call it before a CUDA
  // graph records the tensors' addresses; autograd's grad mode must be off.
  static FlatViews Make(const std::vector<at::Tensor>& tensors);

  // Whether `tensors` are those Make rebound, still where it put them (a
  // tensor replaced since, or another list, is not).
  bool Holds(const std::vector<at::Tensor>& tensors) const;

  std::vector<at::Tensor>& flats() { return flats_; }

 private:
  std::vector<at::Tensor> flats_;
  std::vector<const void*> data_;  // where each tensor's data lies
};

}  // namespace conveyor
