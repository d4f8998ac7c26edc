// Zero-bubble's backward in two passes without computing anything twice.
//
// The input pass runs autograd towards the chunk's inputs only: every node on
// a path to an input computes the gradients that lead there and skips those
// of the parameters (a matmul's weight gradient, a norm's weight and bias).
// At each such node that also leads to parameters (a "boundary": a linear
// layer, a norm) a hook keeps the gradients that reached it. The weight pass
// then starts autograd again at each boundary from what it kept, towards the
// parameters it leads to and no further: each node runs once in each pass,
// for the outputs that pass needs. The parameters' gradients accumulate as in
// one backward (their hooks fire: the replicas' buckets start from them).
//
// A weight pass that ran backward again from the chunk's outputs towards the
// parameters would compute every input gradient a second time: zero-bubble
// took 1.26x 1F1B's step so (2-core CPU machine, 2026-11-27). A parameter reached from two
// boundaries (weights shared within the chunk) would be summed twice: then
// the weight pass falls back to that backward from the outputs.
#pragma once

#include <ATen/Tensor.h>

#include <memory>
#include <vector>

namespace conveyor {

class SplitBackward {
 public:
  // Autograd from `roots` (with `root_grads`; empty for a loss) to `inputs`:
  // their gradients (undefined where none flows), keeping the graph and what
  // the weight pass needs. `params`: the chunk's parameters that require grad.
  static std::vector<at::Tensor> InputPass(const std::vector<at::Tensor>& roots,
                                           const std::vector<at::Tensor>& root_grads,
                                           const std::vector<at::Tensor>& inputs,
                                           const std::vector<at::Tensor>& params,
                                           std::shared_ptr<SplitBackward>* weights);

  // The parameters' gradients, accumulated into their .grad; releases the graph.
  void WeightPass();

  // Bytes of the gradients kept for the weight pass, the outputs' among them
  // (the stage's memory report).
  int64_t kept_bytes() const;
  // Whether the weight pass starts at the boundaries (false: from the outputs again).
  bool split() const { return split_; }

  struct Boundary;
  ~SplitBackward();

 private:
  SplitBackward() = default;

  std::vector<at::Tensor> roots_, root_grads_, params_;
  std::vector<std::shared_ptr<Boundary>> boundaries_;
  bool split_ = false;
};

}  // namespace conveyor
