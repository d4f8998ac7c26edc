// The replicas' gradient all-reduce as DDP's Reducer does it: the stage's
// gradients in buckets of about bucket_cap_mb, each all-reduced as soon as
// every gradient in it is final during the optimizer step's last backward
// pass, so that the sums travel while the backward work that remains runs.
//
// Buckets hold the parameters in reverse order (the last layers' gradients
// are final first) and start strictly in bucket order on every replica, as
// c10d matches collectives by their sequence: a bucket whose gradients are
// ready waits for the ones before it. A gradient is final when autograd
// hands it to the parameter for the last time (a hook on the parameter, with
// the gradient accumulated from the step's earlier micro-batches added); one
// that never comes (a parameter unused in this pass) is taken as it stands at
// Finish. Not thread-safe beyond the hooks: Arm and Finish on the stage's
// executor thread.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "stage_server/replica_group.h"

namespace conveyor {

class GradientReducer {
 public:
  // `params`: the stage's trainable parameters, in the order they are
  // created (forward order); `group` outlives the reducer.
  GradientReducer(ReplicaGroup* group, std::vector<at::Tensor> params, int64_t bucket_bytes);
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // Forgets a step that ended without Finish (it failed): call before each
  // training step.
  void Reset();
  // From now on the gradients that reach parameters [first, last) are final:
  // the next backward pass over them is the optimizer step's last. Joins the
  // group.
  Status Arm(std::size_t first, std::size_t last);
  // Starts the buckets not started yet, waits for all of them, and leaves
  // each parameter's gradient summed over the replicas (defined even where
  // this replica had none). Disarms. The errors of ReplicaGroup.
  Status Finish();

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
  // Hook: parameter i's gradient `grad` is about to be accumulated.
  void OnGradient(std::size_t i, const at::Tensor& grad);
  // Copies parameter i's final gradient into its bucket (mu_ held).
  void Fill(std::size_t i, const at::Tensor& final_grad);
  // Starts every ready bucket whose predecessors have started (mu_ held).
  void StartReady();

  ReplicaGroup* group_;
  std::vector<at::Tensor> params_;
  std::vector<unsigned> hooks_;
  std::vector<std::pair<std::size_t, std::size_t>> slot_;  // parameter -> (bucket, member)
  std::vector<Bucket> buckets_;
  std::vector<Span> spans_;

  std::mutex mu_;  // guards what the hooks touch below
  std::vector<bool> armed_, filled_;
  std::size_t next_ = 0;  // the next bucket to start
  Status error_;
};

}  // namespace conveyor
