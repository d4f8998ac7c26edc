// NcclGroup over NCCL (see nccl_group.h).
//
// The communicator is a blocking one with its connections made when it is
// joined (NCCL_RUNTIME_CONNECT=0 unless the user set it): an operation's
// enqueueing then never waits on the host for a peer, and only Join (on a
// thread of its own, abandoned at the timeout) and Synchronize (polling) wait.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <nccl.h>

#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "transport/nccl/nccl_group.h"
#include "transport/nccl/nccl_join_cuda.h"

namespace conveyor {
namespace {

using Clock = std::chrono::steady_clock;

std::string NcclError(ncclResult_t r) { return std::string(ncclGetErrorString(r)); }

StatusOr<ncclDataType_t> NcclType(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return ncclFloat32;
    case at::kDouble: return ncclFloat64;
    case at::kHalf: return ncclFloat16;
    case at::kBFloat16: return ncclBfloat16;
    case at::kLong: return ncclInt64;
    case at::kInt: return ncclInt32;
    case at::kByte: return ncclUint8;
    case at::kChar: return ncclInt8;
    default: return absl::InvalidArgumentError(std::string("NCCL has no collective for ") + c10::toString(t));
  }
}

class NcclGroupImpl final : public NcclGroup {
 public:
  NcclGroupImpl(ncclComm_t comm, int size, const at::Device& device, std::chrono::milliseconds timeout,
                std::string label)
      : comm_(comm), size_(size), device_(device), timeout_(timeout), label_(std::move(label)),
        stream_(c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device.index())) {}
  ~NcclGroupImpl() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!comm_) return;
    c10::cuda::CUDAGuard guard(device_.index());
    ncclCommAbort(comm_);  // never waits for peers, as ncclCommDestroy may
  }

  StatusOr<c10::Event> AllReduce(at::Tensor t) override {
    return Enqueue("all-reduce", {t}, [&](ncclDataType_t type, cudaStream_t s) {
      return ncclAllReduce(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel()), type, ncclSum, comm_, s);
    });
  }

  StatusOr<c10::Event> Broadcast(at::Tensor t, int root) override {
    return Enqueue("broadcast", {t}, [&](ncclDataType_t type, cudaStream_t s) {
      return ncclBroadcast(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel()), type, root, comm_, s);
    });
  }

  StatusOr<c10::Event> ReduceScatter(at::Tensor in, at::Tensor out) override {
    if (in.numel() != out.numel() * size_ || in.scalar_type() != out.scalar_type())
      return absl::InvalidArgumentError(label_ + ": reduce-scatter of " + std::to_string(in.numel()) + " into " +
                                        std::to_string(out.numel()) + " elements over " + std::to_string(size_));
    return Enqueue("reduce-scatter", {in, out}, [&](ncclDataType_t type, cudaStream_t s) {
      return ncclReduceScatter(in.data_ptr(), out.data_ptr(), static_cast<size_t>(out.numel()), type, ncclSum, comm_, s);
    });
  }

  StatusOr<c10::Event> AllGather(at::Tensor in, at::Tensor out) override {
    if (out.numel() != in.numel() * size_ || in.scalar_type() != out.scalar_type())
      return absl::InvalidArgumentError(label_ + ": all-gather of " + std::to_string(in.numel()) + " into " +
                                        std::to_string(out.numel()) + " elements over " + std::to_string(size_));
    return Enqueue("all-gather", {in, out}, [&](ncclDataType_t type, cudaStream_t s) {
      return ncclAllGather(in.data_ptr(), out.data_ptr(), static_cast<size_t>(in.numel()), type, comm_, s);
    });
  }

  Status Synchronize(const std::function<Status()>& interrupted) override {
    for (int spins = 0;; ++spins) {
      bool idle = false;
      CONVEYOR_RETURN_IF_ERROR(Check(interrupted ? interrupted() : absl::OkStatus(), &idle));
      if (idle) return absl::OkStatus();
      if (spins < 2000) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
  }

  Status Poll(const Status& stop) override {
    bool idle = false;
    return Check(stop, &idle);
  }

 private:
  // Forgets the collectives done; *idle when none is left. Breaks the group
  // when one failed, outlived the timeout, or `stop` is not OK.
  Status Check(const Status& stop, bool* idle) {
    std::lock_guard<std::mutex> lock(mu_);
    CONVEYOR_RETURN_IF_ERROR(broken_);
    while (!in_flight_.empty() && in_flight_.front().done.query()) in_flight_.pop_front();
    *idle = in_flight_.empty();
    if (*idle) return absl::OkStatus();
    if (!stop.ok()) return Break(stop);
    ncclResult_t async = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm_, &async);
    if (r != ncclSuccess || (async != ncclSuccess && async != ncclInProgress)) {
      return Break(absl::UnavailableError(label_ + ": NCCL " + in_flight_.front().what + " failed: " +
                                          NcclError(r != ncclSuccess ? r : async)));
    }
    if (Clock::now() > in_flight_.front().deadline) {
      return Break(absl::DeadlineExceededError(label_ + ": NCCL " + in_flight_.front().what + " took longer than " +
                                               std::to_string(timeout_.count()) +
                                               " ms (a replica is gone or stuck); the group is aborted"));
    }
    return absl::OkStatus();
  }

  struct InFlight {
    at::cuda::CUDAEvent done;
    Clock::time_point deadline;
    std::string what;
    std::vector<at::Tensor> keep;
  };

  template <typename Launch>
  StatusOr<c10::Event> Enqueue(const char* what, std::vector<at::Tensor> tensors, Launch launch) {
    for (const at::Tensor& t : tensors) {
      if (!t.is_cuda() || t.device().index() != device_.index() || !t.is_contiguous())
        return absl::InvalidArgumentError(label_ + ": NCCL " + what + " of a tensor on " + t.device().str() +
                                          (t.is_contiguous() ? "" : ", not contiguous") + "; the group is on " +
                                          device_.str());
    }
    CONVEYOR_ASSIGN_OR_RETURN(ncclDataType_t type, NcclType(tensors.front().scalar_type()));
    std::lock_guard<std::mutex> lock(mu_);
    CONVEYOR_RETURN_IF_ERROR(broken_);
    c10::cuda::CUDAGuard guard(device_.index());
    // After what the caller's stream has enqueued so far (the gradients).
    at::cuda::CUDAEvent ready;
    ready.record(c10::cuda::getCurrentCUDAStream(device_.index()));
    ready.block(stream_);
    const ncclResult_t r = launch(type, stream_.stream());
    if (r != ncclSuccess && r != ncclInProgress)
      return Break(absl::UnavailableError(label_ + ": NCCL " + what + " failed: " + NcclError(r)));
    in_flight_.emplace_back();
    InFlight& op = in_flight_.back();
    op.done.record(stream_);
    op.deadline = Clock::now() + timeout_;
    op.what = what;
    op.keep = std::move(tensors);
    c10::Event done(c10::DeviceType::CUDA);
    done.record(stream_.unwrap());
    return done;
  }

  // Records why the group broke and aborts the communicator (mu_ held).
  Status Break(Status why) {
    if (broken_.ok()) broken_ = why;
    if (comm_) {
      c10::cuda::CUDAGuard guard(device_.index());
      ncclCommAbort(comm_);
      comm_ = nullptr;
    }
    in_flight_.clear();  // aborted: their kernels ended
    return broken_;
  }

  std::mutex mu_;
  ncclComm_t comm_;
  const int size_;
  const at::Device device_;
  const std::chrono::milliseconds timeout_;
  const std::string label_;
  c10::cuda::CUDAStream stream_;
  std::deque<InFlight> in_flight_;
  Status broken_;
};

}  // namespace

StatusOr<std::unique_ptr<NcclGroup>> NcclGroup::Join(const std::string& id, int rank, int size,
                                                     const at::Device& device, std::chrono::milliseconds timeout,
                                                     std::string label) {
  if (!device.is_cuda()) return absl::FailedPreconditionError(label + ": NCCL needs a CUDA device, not " + device.str());
  ncclUniqueId uid;
  if (id.size() != sizeof(uid.internal)) return absl::InvalidArgumentError(label + ": bad NCCL id");
  std::memcpy(uid.internal, id.data(), sizeof(uid.internal));
  setenv("NCCL_NVLS_ENABLE", "0", 0);     // never NVLink multicast (see shared/gpu)
  setenv("NCCL_RUNTIME_CONNECT", "0", 0);  // connect when joining, not at the first collective
  const int index = device.has_index() ? device.index() : 0;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 1;
  auto joining = StartNcclJoin(uid, size, rank, index, config);
  std::unique_lock<std::mutex> lock(joining->mu);
  if (!joining->cv.wait_for(lock, timeout, [&] { return joining->done; })) {
    joining->abandoned = true;
    return absl::DeadlineExceededError(label + ": the replicas did not all join the NCCL group within " +
                                       std::to_string(timeout.count()) + " ms");
  }
  if (joining->result != ncclSuccess || !joining->comm)
    return absl::UnavailableError(label + ": cannot join the NCCL group: " + NcclError(joining->result));
  return std::unique_ptr<NcclGroup>(new NcclGroupImpl(joining->comm, size, at::Device(at::kCUDA, index), timeout,
                                                      std::move(label)));
}

}  // namespace conveyor
