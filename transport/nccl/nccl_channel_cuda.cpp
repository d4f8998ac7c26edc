// NcclChannel over NCCL (built with CUDA LibTorch and NCCL; see nccl_channel.h).
//
// Every operation is enqueued on the channel's own CUDA stream, followed by
// an event; the owner's Progress() polls those events and
// ncclCommGetAsyncError. The host never blocks on a transfer.
//
// The communicator is a blocking one, joined on a thread of its own. A
// nonblocking communicator never blocks a caller, but NCCL runs each of its
// operations through a thread it starts for that operation: about 80 us a
// frame (a stream of 1 MB frames at 13 GB/s on two H200s; blocking, 19 GB/s,
// PyTorch's send/recv 20 to 24 GB/s in the same calls). A blocking operation returns once its kernel is enqueued; only a
// pair's first transfer waits on the host for the peer (NCCL connects the pair
// then), and the peer posts it as soon as the frame's header arrives, which
// travels first. Joining is what may wait long (a peer that never comes): the
// joining thread does that, Join returns at once, and a channel given up
// before it joined leaves the thread to abort the communicator it gets.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <nccl.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "transport/nccl/nccl_channel.h"
#include "transport/nccl/nccl_join_cuda.h"

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
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 1;
    if (max_ctas > 0) {
      config.minCTAs = 1;
      config.maxCTAs = max_ctas;
    }
    joining_ = StartNcclJoin(uid, /*nranks=*/2, rank_, device_.index(), config);
    return absl::OkStatus();
  }

  Status Send(const at::Tensor& t, const c10::Event* ready, Clock::time_point deadline) override {
    if (rank_ != 0) return absl::InternalError(label_ + ": only rank 0 sends");
    c10::cuda::CUDAGuard guard(device_.index());
    const size_t bytes = static_cast<size_t>(t.numel() * t.element_size());
    const std::string what = "to send " + std::to_string(bytes) + " bytes";
    CONVEYOR_RETURN_IF_ERROR(Joined(deadline, what));
    if (ready) ready->block(stream_.unwrap());
    blocked_ = true;
    const ncclResult_t sent = ncclSend(t.data_ptr(), bytes, ncclUint8, /*peer=*/1, comm_, stream_.stream());
    blocked_ = false;
    CONVEYOR_RETURN_IF_ERROR(Check(sent, "send"));
    CONVEYOR_RETURN_IF_ERROR(WaitEnqueued(deadline, what));
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
    CONVEYOR_RETURN_IF_ERROR(Joined(deadline, what));
    blocked_ = true;
    const ncclResult_t received = ncclRecv(t.data_ptr(), bytes, ncclUint8, /*peer=*/0, comm_, stream_.stream());
    blocked_ = false;
    CONVEYOR_RETURN_IF_ERROR(Check(received, "receive"));
    CONVEYOR_RETURN_IF_ERROR(WaitEnqueued(deadline, what));
    Push(deadline, what);
    c10::Event ready(c10::DeviceType::CUDA);
    ready.record(stream_.unwrap());
    return Received{std::move(t), std::move(ready)};
  }

  Status WaitReady(Clock::time_point deadline) override {
    return Joined(deadline, "to set up the link (the peer stage did not join)");
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
    if (blocked_) AbortComm();  // a first transfer waiting on the host for a peer that is gone returns
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

  // Waits until the joining thread has the communicator, or the channel
  // breaks, or `deadline` passes (the channel breaks then).
  Status Joined(Clock::time_point deadline, const std::string& what) {
    if (joined_) return WaitEnqueued(deadline, what);
    for (;;) {
      CONVEYOR_RETURN_IF_ERROR(Healthy());
      std::unique_lock<std::mutex> lock(joining_->mu);
      if (joining_->done) break;
      if (Clock::now() > deadline) {
        lock.unlock();
        return Break(absl::DeadlineExceededError(label_ + ": NCCL took too long " + what +
                                                 " (the peer stage is gone or stuck); the link is aborted"));
      }
      // In slices, so that an Abort() from another thread is seen.
      joining_->cv.wait_for(lock, std::chrono::milliseconds(10));
    }
    ncclResult_t r;
    {
      std::lock_guard<std::mutex> lock(joining_->mu);
      r = joining_->result;
      std::lock_guard<std::mutex> abort_lock(abort_mu_);
      comm_ = joining_->comm;
      joining_->comm = nullptr;
    }
    if (r != ncclSuccess || !comm_)
      return Break(absl::UnavailableError(label_ + ": cannot join the NCCL communicator: " + NcclError(r)));
    joined_ = true;
    return WaitEnqueued(deadline, what);
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
    ncclResult_t r = ncclCommGetAsyncError(comm_, &async);
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
    if (joined_ && !comm_) return Break(absl::UnavailableError(label_ + ": the NCCL link is broken"));
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
    {
      std::lock_guard<std::mutex> lock(joining_->mu);
      joining_->abandoned = true;  // a communicator joined from now on is aborted by its thread
      if (joining_->comm) ncclCommAbort(joining_->comm);
      joining_->comm = nullptr;
    }
    std::lock_guard<std::mutex> lock(abort_mu_);
    if (!comm_) return;
    c10::cuda::CUDAGuard guard(device_.index());
    ncclCommAbort(comm_);
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
  std::mutex abort_mu_;  // guards comm_ against two aborts
  ncclComm_t comm_ = nullptr;  // once joined (Joined)
  // The joining thread's result, shared with it: it may outlive the channel.
  std::shared_ptr<NcclJoining> joining_ = std::make_shared<NcclJoining>();
  bool joined_ = false;  // owner thread only
  std::atomic<bool> blocked_{false};  // the owner is in an NCCL call that may wait for the peer
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
