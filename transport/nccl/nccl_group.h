// NCCL collectives among the copies of one stage across replicas: one
// communicator of R ranks, one GPU each (docs/parallelism.md). The engine DDP
// uses, from the NCCL the stage server already links for its links, rather
// than c10d's ProcessGroupNCCL: one NCCL setup for links and replicas, the
// same header on Debian's CPU LibTorch (which has no ProcessGroupNCCL) and the
// wheel's, and a failure that breaks the group with a status instead of a
// watchdog that ends the process.
//
// A collective is enqueued on the group's own CUDA stream behind the work the
// calling thread's current stream has so far, and returns at once with an
// event after it: the consumer's stream waits for that event on the device.
// Synchronize() is the only host wait: until every collective enqueued is
// done, or one fails or outlives the group's timeout (a dead or stuck peer),
// which aborts the communicator so that nothing waits on it forever. Poll()
// makes the same checks without waiting, for a host that waits for something
// else (a step's end) behind the collectives.
//
// Built where CMake found CUDA LibTorch and NCCL (nccl_group_cuda.cpp);
// elsewhere (nccl_group_stub.cpp) Join fails with FAILED_PRECONDITION.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Event.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "common/status.h"

namespace conveyor {

// Thread-safe.
class NcclGroup {
 public:
  // Joins the communicator of `id` (NewNcclUniqueId, made by rank 0 and
  // shared by the caller) as `rank` of `size` on `device`; waits until every
  // rank has joined, at most `timeout` (DEADLINE_EXCEEDED naming `label`).
  // `timeout` also bounds each collective, from its enqueueing.
  static StatusOr<std::unique_ptr<NcclGroup>> Join(const std::string& id, int rank, int size, const at::Device& device,
                                                   std::chrono::milliseconds timeout, std::string label);
  virtual ~NcclGroup() = default;

  // The collectives: contiguous tensors on the group's device, kept by the
  // group until done. Each returns the event after it (on the group's stream).
  // Sums `t` over the ranks, in place.
  virtual StatusOr<c10::Event> AllReduce(at::Tensor t) = 0;
  // Rank `root`'s `t` to every rank, in place.
  virtual StatusOr<c10::Event> Broadcast(at::Tensor t, int root) = 0;
  // The sum over the ranks of `in` (size x out.numel() elements), rank r's
  // r-th part into `out`.
  virtual StatusOr<c10::Event> ReduceScatter(at::Tensor in, at::Tensor out) = 0;
  // Every rank's `in` into `out` (size x in.numel() elements), rank r's at
  // part r.
  virtual StatusOr<c10::Event> AllGather(at::Tensor in, at::Tensor out) = 0;

  // Waits until every collective enqueued so far is done. UNAVAILABLE when
  // NCCL failed, DEADLINE_EXCEEDED when one took longer than the timeout,
  // and what `interrupted` (if given, polled meanwhile) returns when it is
  // not OK: the group is broken then (every later call fails) and its
  // communicator aborted.
  virtual Status Synchronize(const std::function<Status()>& interrupted) = 0;
  // Synchronize's checks once, without waiting: OK while what was enqueued
  // runs within the timeout (or is done); its errors otherwise, and `stop`
  // when it is not OK and something still runs (the group broken then).
  virtual Status Poll(const Status& stop) = 0;
};

}  // namespace conveyor
