// NCCL for the payloads of one direction of a link between two GPU stages: a
// nonblocking communicator of two ranks, rank 0 sends and rank 1 receives, in
// the order the frames' headers travel on the link's gRPC stream.
//
// Built only where CMake found CUDA LibTorch and NCCL (nccl_channel_cuda.cpp);
// elsewhere (nccl_channel_stub.cpp) NcclBuilt() is false and Join fails.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Event.h>

#include <chrono>
#include <memory>
#include <string>

#include "common/status.h"

namespace conveyor {

bool NcclBuilt();

// A new ncclUniqueId as bytes. Its bootstrap listens in this process: the
// stage that makes it must stay up while the peer joins.
StatusOr<std::string> NewNcclUniqueId();

// Thread-compatible: one thread sends (rank 0) or receives (rank 1) on a
// channel; Abort() alone may come from any thread.
class NcclChannel {
 public:
  using Clock = std::chrono::steady_clock;

  // Starts joining the communicator of `id` as `rank` on `device` and returns
  // at once (nonblocking); the first Send or Receive waits for it.
  static StatusOr<std::unique_ptr<NcclChannel>> Join(const std::string& id, int rank, const at::Device& device,
                                                     std::string label);
  virtual ~NcclChannel() = default;

  // Rank 0: sends `t` (contiguous, on the channel's device) once `ready` (if
  // any) has fired, on the channel's own stream; returns when it is sent and
  // `t` may be freed. By `deadline` or the communicator is aborted and
  // DEADLINE_EXCEEDED names the link; CANCELLED after Abort().
  virtual Status Send(const at::Tensor& t, const c10::Event* ready, Clock::time_point deadline) = 0;
  // Rank 1: receives the next tensor, of `shape` and `dtype`, on the channel's
  // device; returns when it is there (no event left to wait for).
  virtual StatusOr<at::Tensor> Receive(at::IntArrayRef shape, at::ScalarType dtype, Clock::time_point deadline) = 0;
  // Makes Send/Receive in progress and later ones fail; any thread.
  virtual void Abort() = 0;
};

}  // namespace conveyor
