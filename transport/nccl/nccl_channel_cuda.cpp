// NcclChannel over NCCL (built with CUDA LibTorch and NCCL; see nccl_channel.h).
//
// Every operation is enqueued on the channel's own CUDA stream, followed by
// an event; the owner's Progress() polls those events and
// ncclCommGetAsyncError. The host never blocks on a transfer.
//
// Two communicators: the one joined is nonblocking, so that joining never
// blocks a thread (the peer may be slow to join, or never); but NCCL runs
// every operation of a nonblocking communicator through a thread it starts
// for that operation, which cost about 80 us a frame (1 MB frames at 13 GB/s
// on two H200s). Transfers go through a blocking child of it
// (ncclCommSplit), made by each side's first transfer, when both sides are
// known to be there: the sender splits after its first header went out, the
// receiver when that header arrives. A blocking operation returns once it is
// enqueued; only the child's first one per side may wait on the host for the
// peer (NCCL connects the pair then). Abort() aborts both from any thread, so
// that a thread blocked there returns.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <nccl.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "transport/nccl/nccl_channel.h"

namespace conveyor {
namespace {

using Clock = std::chrono::steady_clock;

std::string NcclError(ncclResult_t r) { return std::string(ncclGetErrorString(r)); }

class NcclChannelImpl final : public NcclChannel {
 public:
  NcclChannelImpl(int rank, const at::Device& device, std::string label)
      : rank_(rank), device_(device), label_(std::move(label)),
        stream_(c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device.index())) {}
  ~NcclChannelImpl() override { AbortComm(); }

  Status Init(const std::string& id, int max_ctas) {
    ncclUniqueId uid;
    if (id.size() != sizeof(uid.internal)) return absl::InvalidArgumentError(label_ + ": bad NCCL id");
    std::memcpy(uid.internal, id.data(), sizeof(uid.internal));
    c10::cuda::CUDAGuard guard(device_.index());
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    max_ctas_ = max_ctas;
    if (max_ctas > 0) {
      config.minCTAs = 1;
      config.maxCTAs = max_ctas;
    }
    ncclResult_t r = ncclCommInitRankConfig(&comm_, 2, uid, rank_, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      return absl::UnavailableError(label_ + ": cannot join the NCCL communicator: " + NcclError(r));
    }
    return absl::OkStatus();
  }

  Status Send(const at::Tensor& t, const c10::Event* ready, Clock::time_point deadline) override {
    if (rank_ != 0) return absl::InternalError(label_ + ": only rank 0 sends");
    c10::cuda::CUDAGuard guard(device_.index());
    const size_t bytes = static_cast<size_t>(t.numel() * t.element_size());
    const std::string what = "to send " + std::to_string(bytes) + " bytes";
    CONVEYOR_ASSIGN_OR_RETURN(ncclComm_t comm, DataComm(deadline, what));
    if (ready) ready->block(stream_.unwrap());
    blocked_ = true;  // the child's first transfer may wait for the peer (NCCL connects then)
    const ncclResult_t r = ncclSend(t.data_ptr(), bytes, ncclUint8, /*peer=*/1, comm, stream_.stream());
    blocked_ = false;
    CONVEYOR_RETURN_IF_ERROR(Enqueued(r, comm, deadline, what, "send"));
    InFlight& op = Push(deadline, what);
    op.keep = t;  // the sender may drop it at once: ours until sent
    return absl::OkStatus();
  }

  StatusOr<Received> Receive(at::IntArrayRef shape, at::ScalarType dtype, Clock::time_point deadline) override {
    if (rank_ != 1) return absl::InternalError(label_ + ": only rank 1 receives");
    c10::cuda::CUDAGuard guard(device_.index());
    at::Tensor t;
    {
      // Allocated from our stream's pool: the block is never one that
      // kernels queued on the compute stream still use, and receives need
      // not wait for the compute stream. The reader records its stream.
      c10::cuda::CUDAStreamGuard on_ours(stream_);
      t = at::empty(shape, at::TensorOptions().dtype(dtype).device(device_));
    }
    const size_t bytes = static_cast<size_t>(t.numel() * t.element_size());
    const std::string what = "to receive " + std::to_string(bytes) + " bytes";
    CONVEYOR_ASSIGN_OR_RETURN(ncclComm_t comm, DataComm(deadline, what));
    blocked_ = true;
    const ncclResult_t r = ncclRecv(t.data_ptr(), bytes, ncclUint8, /*peer=*/0, comm, stream_.stream());
    blocked_ = false;
    CONVEYOR_RETURN_IF_ERROR(Enqueued(r, comm, deadline, what, "receive"));
    Push(deadline, what);
    c10::Event ready(c10::DeviceType::CUDA);
    ready.record(stream_.unwrap());
    return Received{std::move(t), std::move(ready)};
  }

  Status WaitReady(Clock::time_point deadline) override {
    return WaitEnqueued(deadline, "to set up the link (the peer stage did not join)");
  }

  Status Progress() override {
    while (!in_flight_.empty() && in_flight_.front().done.query()) in_flight_.pop_front();
    if (in_flight_.empty()) return Healthy();
    return Poll(in_flight_.front().deadline, in_flight_.front().what);
  }

  bool Idle() const override { return in_flight_.empty(); }

  Status status() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return broken_;
  }

  void Abort() override {
    aborted_ = true;
    // A thread blocked in a blocking call (the split, the child's first
    // transfer) returns once its communicator is aborted.
    if (blocked_) AbortComm();
  }

 private:
  struct InFlight {
    at::cuda::CUDAEvent done;
    Clock::time_point deadline;
    std::string what;
    at::Tensor keep;
  };

  InFlight& Push(Clock::time_point deadline, const std::string& what) {
    in_flight_.emplace_back();
    InFlight& op = in_flight_.back();
    op.done.record(stream_);
    op.deadline = deadline;
    op.what = what;
    return op;
  }

  Status Check(ncclResult_t r, const char* what) {
    if (r == ncclSuccess || r == ncclInProgress) return absl::OkStatus();
    return Break(absl::UnavailableError(label_ + ": NCCL " + what + " failed: " + NcclError(r)));
  }

  // The communicator transfers go through: the blocking child, split off
  // the joined one by this side's first transfer (see the top of the file).
  StatusOr<ncclComm_t> DataComm(Clock::time_point deadline, const std::string& what) {
    if (data_) {
      CONVEYOR_RETURN_IF_ERROR(Poll(deadline, what));
      return data_;
    }
    CONVEYOR_RETURN_IF_ERROR(WaitEnqueued(deadline, what));  // the joined communicator is up
#if defined(NCCL_VERSION_CODE) && NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0)
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 1;
    if (max_ctas_ > 0) {
      config.minCTAs = 1;
      config.maxCTAs = max_ctas_;
    }
    ncclComm_t child = nullptr;
    blocked_ = true;
    ncclResult_t r = ncclCommSplit(comm_, /*color=*/0, /*key=*/rank_, &child, &config);
    blocked_ = false;
    if (r != ncclSuccess && r != ncclInProgress) {
      CONVEYOR_RETURN_IF_ERROR(Healthy());  // aborted meanwhile: says so
      return Break(absl::UnavailableError(label_ + ": cannot split the NCCL communicator: " + NcclError(r)));
    }
    {
      std::lock_guard<std::mutex> lock(abort_mu_);
      if (!comm_) {  // aborted while it split
        if (child) ncclCommAbort(child);
        child = nullptr;
      }
      data_ = child;
    }
    CONVEYOR_RETURN_IF_ERROR(Healthy());
    // Where NCCL made the split as the parent's mode says (nonblocking), the
    // child is usable once it reports no operation in progress.
    for (int spins = 0;; ++spins) {
      ncclResult_t async = ncclSuccess;
      if (ncclCommGetAsyncError(data_, &async) != ncclSuccess || (async != ncclSuccess && async != ncclInProgress))
        return Break(absl::UnavailableError(label_ + ": the NCCL communicator's split failed"));
      if (async == ncclSuccess) break;
      CONVEYOR_RETURN_IF_ERROR(Poll(deadline, what));
      Backoff(spins);
    }
    return data_;
#else
    return comm_;  // NCCL before 2.18: no split, every transfer through the joined one
#endif
  }

  // After an operation on `comm`: through the joined (nonblocking)
  // communicator, waits until NCCL's thread has enqueued it.
  Status Enqueued(ncclResult_t r, ncclComm_t comm, Clock::time_point deadline, const std::string& what,
                  const char* op) {
    CONVEYOR_RETURN_IF_ERROR(Check(r, op));
    if (comm == comm_) return WaitEnqueued(deadline, what);
    return Healthy();
  }

  // Polls the communicator until it has nothing in progress (its start, or
  // the enqueueing of an operation): only then is an operation on the stream.
  Status WaitEnqueued(Clock::time_point deadline, const std::string& what) {
    for (int spins = 0;; ++spins) {
      CONVEYOR_RETURN_IF_ERROR(Poll(deadline, what));
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async == ncclSuccess) return absl::OkStatus();
      Backoff(spins);
    }
  }

  // An error when the channel was aborted or broken, the communicator failed
  // or the deadline passed; the channel breaks then.
  Status Poll(Clock::time_point deadline, const std::string& what) {
    CONVEYOR_RETURN_IF_ERROR(Healthy());
    ncclResult_t async = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(data_ ? data_ : comm_, &async);
    if (r != ncclSuccess || (async != ncclSuccess && async != ncclInProgress)) {
      return Break(absl::UnavailableError(label_ + ": NCCL failed " + what + ": " +
                                          NcclError(r != ncclSuccess ? r : async)));
    }
    if (Clock::now() > deadline) {
      return Break(absl::DeadlineExceededError(label_ + ": NCCL took too long " + what +
                                               " (the peer stage is gone or stuck); the link is aborted"));
    }
    return absl::OkStatus();
  }

  Status Healthy() {
    if (aborted_) return Break(absl::CancelledError(label_ + ": the NCCL link was closed"));
    Status st = status();
    if (!st.ok()) return st;
    if (!comm_) return Break(absl::UnavailableError(label_ + ": the NCCL link is broken"));
    return absl::OkStatus();
  }

  // Records why the channel broke, then aborts the communicator (which ends
  // the operations in flight); returns the reason.
  Status Break(Status why) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (broken_.ok()) broken_ = why;
      why = broken_;
    }
    AbortComm();
    return why;
  }

  static void Backoff(int spins) {
    if (spins < 2000) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  void AbortComm() {
    std::lock_guard<std::mutex> lock(abort_mu_);
    c10::cuda::CUDAGuard guard(device_.index());
    if (data_) ncclCommAbort(data_);
    data_ = nullptr;
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
  }

  const int rank_;
  const at::Device device_;
  const std::string label_;
  c10::cuda::CUDAStream stream_;
  std::deque<InFlight> in_flight_;  // owner thread only, oldest first
  std::atomic<bool> aborted_{false};
  mutable std::mutex mu_;  // guards broken_
  Status broken_;
  std::mutex abort_mu_;  // guards comm_ and data_ against two aborts
  ncclComm_t comm_ = nullptr;  // joined, nonblocking
  ncclComm_t data_ = nullptr;  // split off comm_, blocking: the transfers' (DataComm)
  int max_ctas_ = 0;
  std::atomic<bool> blocked_{false};  // the owner is in a blocking call (the split)
};

}  // namespace

bool NcclBuilt() { return true; }

StatusOr<std::string> NewNcclUniqueId() {
  setenv("NCCL_NVLS_ENABLE", "0", 0);  // never NVLink multicast (see shared/gpu)
  ncclUniqueId id;
  ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) return absl::UnavailableError("ncclGetUniqueId failed: " + NcclError(r));
  return std::string(id.internal, sizeof(id.internal));
}

StatusOr<std::unique_ptr<NcclChannel>> NcclChannel::Join(const std::string& id, int rank, const at::Device& device,
                                                         int max_ctas, std::string label) {
  if (!device.is_cuda()) return absl::FailedPreconditionError(label + ": NCCL needs a CUDA device, not " + device.str());
  setenv("NCCL_NVLS_ENABLE", "0", 0);
  at::Device d = device.has_index() ? device : at::Device(at::kCUDA, c10::cuda::current_device());
  auto channel = std::make_unique<NcclChannelImpl>(rank, d, std::move(label));
  CONVEYOR_RETURN_IF_ERROR(channel->Init(id, max_ctas));
  return std::unique_ptr<NcclChannel>(std::move(channel));
}

}  // namespace conveyor
