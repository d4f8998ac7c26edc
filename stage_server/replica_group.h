// The copies of one stage across a job's replicas (docs/parallelism.md): a
// c10d process group (ProcessGroupGloo, PyTorch DDP's CPU engine) that
// averages their gradients before the optimizer step, and, where the
// coordinator chose NCCL for the stage (GPUs of their own), an NcclGroup
// that sums CUDA tensors on the devices instead (Gloo then carries only the
// bytes of checkpoints).
//
// Replica 0's stage serves the group's store (c10d's TCPStore) from
// Configure on; every member joins the group at its first all-reduce, which
// all of them reach in the same training step (the coordinator starts a step
// on every stage at once). Not thread-safe: the stage's executor thread only.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Event.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace conveyor {

// Whether this build has c10d's Gloo group (Debian's LibTorch with
// libgloo-dev; elsewhere a replicated job fails with UNIMPLEMENTED).
bool ReplicaGroupsAvailable();

// The store that replica 0's stage serves for its group: a TCPStore on an
// ephemeral port of every interface, until destroyed.
class ReplicaStore {
 public:
  static StatusOr<std::unique_ptr<ReplicaStore>> Serve(std::chrono::milliseconds timeout);
  virtual ~ReplicaStore() = default;
  virtual int port() const = 0;
};

class ReplicaGroup {
 public:
  struct Options {
    std::string store;  // host:port of replica 0's ReplicaStore
    std::string host;   // the name this member's group transport listens on
    int rank = 0;       // the replica
    int size = 1;       // replicas
    std::chrono::milliseconds timeout{10000};  // joining, and each collective
    std::string who;    // "stage 1 of replica 0", for errors
    // Sum CUDA tensors with NCCL (every member on a GPU of its own) on
    // `device`, the stage's.
    bool nccl = false;
    at::Device device{at::kCPU};
    // Polled while the host waits for NCCL (Confirm): not OK ends the wait
    // with its status (the step was aborted). Any thread's; may be empty.
    std::function<Status()> interrupted;
  };
  // Only records the options: the group is joined at the first collective
  // (or Join).
  explicit ReplicaGroup(Options options);
  ~ReplicaGroup();
  ReplicaGroup(const ReplicaGroup&) = delete;
  ReplicaGroup& operator=(const ReplicaGroup&) = delete;

  int rank() const { return options_.rank; }
  int size() const { return options_.size; }

  // Meets the other members at the store (once; later calls return at once).
  Status Join();

  // Sums `grads` (undefined ones count as zeros and come back defined) over
  // the group, in place, as one flat buffer per dtype and device; on the
  // host's return the sums are there (Confirm included).
  // DEADLINE_EXCEEDED or UNAVAILABLE naming the group when a member does not
  // take part within the timeout (a dead peer ends in an error, not a hang).
  Status AllReduce(std::vector<at::Tensor>& grads);

  // One all-reduce in flight (StartAllReduce): the sum lands in the tensor
  // given, in place.
  class Work {
   public:
    virtual ~Work() = default;
    // Until the sum is in place for the caller, at most the group's timeout;
    // the errors of AllReduce. On the host (Gloo), or, for a sum on the
    // device (NCCL), by making the calling thread's current CUDA stream wait
    // for it: the host returns at once, and Confirm says whether it worked.
    virtual Status Wait() = 0;
    // Host times, microseconds since the epoch: started, and done (0 until
    // it is).
    virtual int64_t start_us() const = 0;
    virtual int64_t end_us() const = 0;
  };
  // Starts summing `flat` over the group and returns at once. Every member
  // must start the same all-reduces in the same order (c10d matches them by
  // their sequence). Joins first if it has not.
  StatusOr<std::unique_ptr<Work>> StartAllReduce(at::Tensor flat);
  // ZeRO-1's halves of an all-reduce, on a flat tensor of size() equal
  // slices, slice r this member's (rank r). StartReduceScatter: the sum over
  // the group of this member's slice lands in it, in place (what the other
  // slices then hold is undefined); the same order rules as StartAllReduce.
  // NCCL reduce-scatters; Gloo (LibTorch 1.13's has no reduce-scatter)
  // all-reduces the whole. AllGather: in each of `flats`, every member's
  // slice to every member, in place, with AllReduce's errors and waits.
  StatusOr<std::unique_ptr<Work>> StartReduceScatter(at::Tensor flat);
  Status AllGather(const std::vector<at::Tensor>& flats);
  // Waits on the host until every collective on the device is done (a Work's
  // end time is then known): call after the work that uses their results is
  // enqueued and before those results leave the device. The errors of
  // AllReduce. OK at once where nothing runs on the device.
  Status Confirm();
  // Whether CUDA tensors are summed on the device (NCCL).
  bool on_device() const { return options_.nccl; }

  // A step whose end another thread waits for (two steps in flight): while
  // deferred, Confirm (and so AllReduce, Broadcast) does not wait on the host,
  // and the collectives' end times are not taken (their Works' end_us stay
  // 0). That thread watches the collectives with Watcher() instead while it
  // waits for the step's last work, which comes after them on the device.
  void DeferConfirm(bool defer) { defer_confirm_ = defer; }
  // Checks the device collectives enqueued so far without waiting (NcclGroup::
  // Poll): OK while they run within the timeout; the error otherwise, or
  // `stop` when it is not OK and one still runs (the group is broken and its
  // communicator aborted, so that the device does not wait on it forever).
  // Any thread's; it keeps the group it watches. Null where nothing is summed
  // on the device.
  std::function<Status(const Status& stop)> Watcher();

  // Replica `root`'s `tensors` to every member, in place (same shapes and
  // dtypes everywhere).
  Status Broadcast(std::vector<at::Tensor>& tensors, int root = 0);
  // Replica `root`'s `*bytes` to every member.
  Status BroadcastBytes(std::string* bytes, int root = 0);

 private:
  struct Impl;
  bool defer_confirm_ = false;
  // The status of a collective that threw `e`; forgets the group, so the
  // next collective joins anew.
  Status Failure(const std::string& what, const std::exception& e);
  // Joins the NCCL group (options_.nccl), its id shared through the store.
  Status JoinNccl();
  // The Work of a collective enqueued on the device (`done`: the event after
  // it), its end left for Confirm; forgets the group where it failed.
  StatusOr<std::unique_ptr<Work>> OnDevice(StatusOr<c10::Event> done);
  Options options_;
  int nccl_joins_ = 0;
  std::unique_ptr<Impl> impl_;
};

}  // namespace conveyor
