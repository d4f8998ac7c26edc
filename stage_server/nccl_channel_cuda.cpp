// NcclChannel over NCCL (built with CUDA LibTorch and NCCL; see nccl_channel.h).
//
// Every operation is enqueued on the channel's own CUDA stream and the
// calling (transport) thread polls for its end: the event recorded after it
// and ncclCommGetAsyncError, until the deadline. The compute stream never
// waits on NCCL work that might not finish: a receiver hands a tensor on only
// once it is complete, a sender's stream waits for the producer's event.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <nccl.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "stage_server/nccl_channel.h"

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

  Status Init(const std::string& id) {
    ncclUniqueId uid;
    if (id.size() != sizeof(uid.internal)) return absl::InvalidArgumentError(label_ + ": bad NCCL id");
    std::memcpy(uid.internal, id.data(), sizeof(uid.internal));
    c10::cuda::CUDAGuard guard(device_.index());
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&comm_, 2, uid, rank_, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      return absl::UnavailableError(label_ + ": cannot join the NCCL communicator: " + NcclError(r));
    }
    return absl::OkStatus();
  }

  Status Send(const at::Tensor& t, const c10::Event* ready, Clock::time_point deadline) override {
    if (rank_ != 0) return absl::InternalError(label_ + ": only rank 0 sends");
    c10::cuda::CUDAGuard guard(device_.index());
    CONVEYOR_RETURN_IF_ERROR(WaitIdle(deadline, "to connect"));
    if (ready) ready->block(stream_.unwrap());
    const size_t bytes = static_cast<size_t>(t.numel() * t.element_size());
    ncclResult_t r = ncclSend(t.data_ptr(), bytes, ncclUint8, /*peer=*/1, comm_, stream_.stream());
    CONVEYOR_RETURN_IF_ERROR(Check(r, "send"));
    return WaitDone(deadline, "to send " + std::to_string(bytes) + " bytes");
  }

  StatusOr<at::Tensor> Receive(at::IntArrayRef shape, at::ScalarType dtype, Clock::time_point deadline) override {
    if (rank_ != 1) return absl::InternalError(label_ + ": only rank 1 receives");
    c10::cuda::CUDAGuard guard(device_.index());
    CONVEYOR_RETURN_IF_ERROR(WaitIdle(deadline, "to connect"));
    // Allocated on the device's current (compute) stream, written on ours:
    // it is handed on only once written, so no stream needs recording. But
    // the caching allocator may hand out a block that kernels still queued on
    // the current stream read: our stream waits for them before writing.
    at::Tensor t = at::empty(shape, at::TensorOptions().dtype(dtype).device(device_));
    at::cuda::CUDAEvent allocated;
    allocated.record(c10::cuda::getCurrentCUDAStream(device_.index()));
    allocated.block(stream_);
    const size_t bytes = static_cast<size_t>(t.numel() * t.element_size());
    ncclResult_t r = ncclRecv(t.data_ptr(), bytes, ncclUint8, /*peer=*/0, comm_, stream_.stream());
    CONVEYOR_RETURN_IF_ERROR(Check(r, "receive"));
    CONVEYOR_RETURN_IF_ERROR(WaitDone(deadline, "to receive " + std::to_string(bytes) + " bytes"));
    return t;
  }

  void Abort() override { aborted_ = true; }

 private:
  Status Check(ncclResult_t r, const char* what) {
    if (r == ncclSuccess || r == ncclInProgress) return absl::OkStatus();
    AbortComm();
    return absl::UnavailableError(label_ + ": NCCL " + what + " failed: " + NcclError(r));
  }

  // Polls the communicator until it has nothing in progress (its start, or
  // the enqueueing of an operation).
  Status WaitIdle(Clock::time_point deadline, const std::string& what) {
    for (int spins = 0;; ++spins) {
      CONVEYOR_RETURN_IF_ERROR(Poll(deadline, what));
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async == ncclSuccess) return absl::OkStatus();
      Backoff(spins);
    }
  }

  // Waits for the operation just enqueued on stream_ to finish.
  Status WaitDone(Clock::time_point deadline, const std::string& what) {
    CONVEYOR_RETURN_IF_ERROR(WaitIdle(deadline, what));
    done_.record(stream_);
    for (int spins = 0;; ++spins) {
      if (done_.query()) return absl::OkStatus();
      CONVEYOR_RETURN_IF_ERROR(Poll(deadline, what));
      Backoff(spins);
    }
  }

  // An error when the channel was aborted, the communicator failed or the
  // deadline passed; the communicator is aborted then.
  Status Poll(Clock::time_point deadline, const std::string& what) {
    if (aborted_) {
      AbortComm();
      return absl::CancelledError(label_ + ": the NCCL link was closed");
    }
    if (!comm_) return absl::UnavailableError(label_ + ": the NCCL link is broken");
    ncclResult_t async = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(comm_, &async);
    if (r != ncclSuccess || (async != ncclSuccess && async != ncclInProgress)) {
      AbortComm();
      return absl::UnavailableError(label_ + ": NCCL failed " + what + ": " +
                                    NcclError(r != ncclSuccess ? r : async));
    }
    if (Clock::now() > deadline) {
      AbortComm();
      return absl::DeadlineExceededError(label_ + ": NCCL took too long " + what +
                                         " (the peer stage is gone or stuck); the link is aborted");
    }
    return absl::OkStatus();
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
    if (!comm_) return;
    c10::cuda::CUDAGuard guard(device_.index());
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }

  const int rank_;
  const at::Device device_;
  const std::string label_;
  c10::cuda::CUDAStream stream_;
  at::cuda::CUDAEvent done_;
  std::atomic<bool> aborted_{false};
  std::mutex abort_mu_;  // guards comm_ against two aborts
  ncclComm_t comm_ = nullptr;
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
                                                         std::string label) {
  if (!device.is_cuda()) return absl::FailedPreconditionError(label + ": NCCL needs a CUDA device, not " + device.str());
  setenv("NCCL_NVLS_ENABLE", "0", 0);
  at::Device d = device.has_index() ? device : at::Device(at::kCUDA, c10::cuda::current_device());
  auto channel = std::make_unique<NcclChannelImpl>(rank, d, std::move(label));
  CONVEYOR_RETURN_IF_ERROR(channel->Init(id));
  return std::unique_ptr<NcclChannel>(std::move(channel));
}

}  // namespace conveyor
