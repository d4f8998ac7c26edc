// Joining an NCCL communicator on a thread of its own (for the CUDA sources
// of nccl/ only: it includes nccl.h). ncclCommInitRank waits for every rank;
// the caller waits on NcclJoining with its own deadline and, when it gives
// up, marks it abandoned: the thread then aborts the communicator it gets.
#pragma once

#include <c10/cuda/CUDAGuard.h>
#include <nccl.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

namespace conveyor {

// What the joining thread leaves; shared with it (it may outlive its caller).
struct NcclJoining {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  bool abandoned = false;  // the caller gave up: the thread aborts what it joins
  ncclResult_t result = ncclSuccess;
  ncclComm_t comm = nullptr;  // joined and not yet taken by the caller
};

// Starts joining the communicator of `uid` as `rank` of `nranks` on CUDA
// device `device` with `config`, on a detached thread; returns at once.
inline std::shared_ptr<NcclJoining> StartNcclJoin(const ncclUniqueId& uid, int nranks, int rank, int device,
                                                  ncclConfig_t config) {
  auto joining = std::make_shared<NcclJoining>();
  std::thread([joining, uid, nranks, rank, device, config]() mutable {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    ncclComm_t comm = nullptr;
    const ncclResult_t r = ncclCommInitRankConfig(&comm, nranks, uid, rank, &config);
    std::lock_guard<std::mutex> lock(joining->mu);
    if (joining->abandoned) {  // given up meanwhile: nobody will use it
      if (r == ncclSuccess && comm) ncclCommAbort(comm);
    } else {
      joining->comm = r == ncclSuccess ? comm : nullptr;
    }
    joining->result = r;
    joining->done = true;
    joining->cv.notify_all();
  }).detach();
  return joining;
}

}  // namespace conveyor
