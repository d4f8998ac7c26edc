// A stage's training passes replayed as CUDA graphs (job key cuda_graphs).
//
// Each chunk's forward and backward of each micro-batch is a pair of graphs,
// recorded the first time it runs and replayed from then on. Every pair owns
// its memory (the activations its backward reads among it), so replaying the
// forward of micro-batch 2 leaves what the backward of micro-batch 1 still
// needs alone, whatever the schedule's order. A graph reads and writes fixed
// tensors: inputs and gradients received are copied into the pair's own, and
// the parameters' gradients accumulate into tensors that must stay where they
// are (ZeroGrads between steps, not an optimizer's zero_grad, which may drop
// them). What a pass returns lives in the pair's tensors, rewritten when that
// pass is replayed again (the next step).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include "model/partition.h"

#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "common/status.h"
#include "stage_server/device_graph.h"

namespace conveyor {

// Thread-compatible: the stage's executor thread.
class GraphedPasses {
 public:
  // What the last chunk computes from its output and labels: the loss.
  using Head = std::function<at::Tensor(const at::Tensor& output, const at::Tensor& labels)>;
  struct Forwarded {
    at::Tensor input;   // the pair's copy of the input
    at::Tensor output;  // what the backward starts from: the activation, or the loss
  };

  explicit GraphedPasses(at::Device device) : device_(device) {}
  // Whether this build has graphs on the device (CUDA).
  static bool Available(const at::Device& device);

  // The forward of micro-batch `mb` of local chunk `chunk`: `input` through
  // `layers`, then `head` against `labels` when `head` is set. With
  // `input_grad`, the backward gives the input's gradient.
  StatusOr<Forwarded> Forward(int chunk, int mb, Partition& layers, const at::Tensor& input,
                              bool input_grad, const at::Tensor& labels, const Head& head);
  // Its backward, from `grad` (undefined: the output is a loss), accumulating
  // into `params`' gradients; the input's gradient, or undefined.
  StatusOr<at::Tensor> Backward(int chunk, int mb, const at::Tensor& grad, const std::vector<at::Tensor>& params);

  // Zeroes gradients in place (a graph has their addresses).
  static void ZeroGrads(const std::vector<at::Tensor>& params);

 private:
  struct Pair {
    std::unique_ptr<DeviceGraph> forward, backward;
    at::Tensor input, labels, output, grad;
  };
  const at::Device device_;
  std::map<std::pair<int, int>, Pair> pairs_;  // (local chunk, micro-batch)
};

}  // namespace conveyor
