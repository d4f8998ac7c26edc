// The replicas' gradient all-reduce as DDP's Reducer does it: the stage's
// gradients in buckets of about bucket_cap_mb, each all-reduced as soon as
// every gradient in it is final during the optimizer step's last backward
// pass, so that the sums travel while the backward work that remains runs.
//
// Each parameter's gradient is a view into its bucket's flat buffer, with the
// parameter's own strides (DDP's gradient_as_bucket_view): autograd
// accumulates into the bucket in place, the all-reduce sums the bucket in
// place, and no gradient is copied in or out. The gradients are zeroed with
// the buckets (ZeroGrads), never set to none.
//
// Buckets hold the parameters in reverse order (the last layers' gradients
// are final first) and start strictly in bucket order on every replica, as
// c10d matches collectives by their sequence: a bucket whose gradients are
// ready waits for the ones before it. A gradient is final when autograd has
// accumulated into the parameter for the last time (a hook after the
// parameter's gradient accumulator); one that never comes (a parameter unused
// in this pass) is taken as it stands at Finish. Not thread-safe beyond the
// hooks: the rest on the stage's executor thread.
//
// ZeRO-1 (made with `slice`): each bucket, padded to a multiple of the
// group's size, is reduce-scattered instead: member r gets the sums of its
// r-th slice of every bucket, updates the parameters' elements that lie
// there (SliceParameters), and every member's slices come back to all
// (GatherParameters): a reduce-scatter and an all-gather move the bytes of
// one all-reduce, and each member keeps the optimizer state of 1/R of the
// elements.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "stage_server/replica_group.h"

namespace torch {
namespace autograd {
struct Node;
}  // namespace autograd
}  // namespace torch

namespace conveyor {

class GradientReducer {
 public:
  // `params`: the stage's trainable parameters, in the order they are
  // created (forward order); their gradients become views of the buckets
  // (holding what they held). `group` outlives the reducer. Without `hooks`
  // (passes replayed as CUDA graphs) no bucket starts during backward: all
  // start in Finish. With `slice`, Finish reduce-scatters (ZeRO-1, above).
  GradientReducer(ReplicaGroup* group, std::vector<at::Tensor> params, int64_t bucket_bytes, bool hooks = true,
                  bool slice = false);
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // Zeroes every gradient (a few kernels: the buckets), in place; a
  // gradient that something replaced is made the bucket's view again.
  void ZeroGrads();
  // Forgets a step that ended without Finish (it failed): call before each
  // training step.
  void Reset();
  // From now on the gradients that reach parameters [first, last) are final:
  // the next backward pass over them is the optimizer step's last. Joins the
  // group.
  Status Arm(std::size_t first, std::size_t last);
  // Starts the buckets not started yet, waits for all of them, and leaves
  // each parameter's gradient summed over the replicas. Disarms. Without Arm
  // or hooks every bucket starts here, in order. The errors of ReplicaGroup.
  Status Finish();

  // ZeRO-1: rebinds the parameters as views of flat tensors laid out as the
  // gradients' buckets (their values kept), and returns, for each parameter
  // with elements in this member's slice of its bucket, those elements (in
  // memory order) as a flat tensor of their own whose gradient is the same
  // part of the bucket: what this member's optimizer updates. Call once,
  // with autograd's grad mode off, before anything records the parameters'
  // addresses (CUDA graphs). Made without `slice`: nothing.
  struct Part {
    std::size_t param;  // index into the constructor's params
    at::Tensor tensor;
  };
  std::vector<Part> SliceParameters();
  // After the parts were updated: every member's slices to every member, in
  // place (one all-gather per bucket). The errors of ReplicaGroup.
  Status GatherParameters();

  // ZeRO-1 state laid out as the parameters, so that a checkpoint holds it
  // by parameter and loads under any replica count or cut. GatherWhole:
  // from one field of this member's parts (a flat tensor each, in
  // SliceParameters' order; undefined: zeros), every parameter's whole field
  // (its shape), gathered from every member: a collective, called by every
  // member at the same point. PartsOf, its inverse without communication:
  // from every parameter's whole field, this member's parts of it.
  StatusOr<std::vector<at::Tensor>> GatherWhole(const std::vector<at::Tensor>& parts);
  StatusOr<std::vector<at::Tensor>> PartsOf(const std::vector<at::Tensor>& whole) const;

  struct Span {
    int bucket;
    int64_t start_us, end_us;  // host time, microseconds since the epoch
  };
  // The last Finish's buckets: when each all-reduce started and ended.
  const std::vector<Span>& spans() const { return spans_; }
  int num_buckets() const { return static_cast<int>(buckets_.size()); }

 private:
  struct Bucket {
    std::vector<std::size_t> members;  // indices into params_
    std::vector<int64_t> offsets;      // each member's first element in `flat`
    at::Tensor flat;
    std::size_t ready = 0;
    std::unique_ptr<ReplicaGroup::Work> work;
  };
  // Parameter i's view of `flat`, laid out as its bucket (gradients' or,
  // sliced, parameters').
  at::Tensor ViewIn(const at::Tensor& flat, std::size_t i) const;
  at::Tensor View(std::size_t i) const { return ViewIn(buckets_[slot_[i].first].flat, i); }
  // Makes parameter i's gradient its view again where it is not (mu_ held).
  void Attach(std::size_t i);
  // Hook: autograd has accumulated parameter i's gradient.
  void OnAccumulated(std::size_t i);
  // Counts parameter i's gradient as final (mu_ held).
  void MarkReady(std::size_t i);
  // Starts every ready bucket whose predecessors have started (mu_ held).
  void StartReady();

  ReplicaGroup* group_;
  bool slice_;
  std::vector<at::Tensor> params_;
  std::vector<at::Tensor> param_flats_;  // sliced: the parameters, by bucket
  struct Place {
    std::size_t bucket;
    int64_t lo, hi;  // the part's elements in its bucket
  };
  std::vector<Place> places_;  // sliced: SliceParameters' parts
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;  // kept: a new one would lack the hook
  std::vector<uintptr_t> hooks_;
  std::vector<std::pair<std::size_t, std::size_t>> slot_;  // parameter -> (bucket, member)
  std::vector<Bucket> buckets_;
  std::vector<const void*> view_data_;  // where each parameter's view starts: a cheap test of Attach's
  std::vector<Span> spans_;

  std::mutex mu_;  // guards what the hooks touch below
  std::vector<bool> armed_, ready_;
  std::size_t next_ = 0;  // the next bucket to start
  Status error_;
};

}  // namespace conveyor
