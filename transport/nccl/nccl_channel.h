// NCCL for the payloads of one direction of a link between two GPU stages: a
// nonblocking communicator of two ranks, rank 0 sends and rank 1 receives, in
// the order the frames' headers travel on the link's gRPC stream.
//
// Nothing here makes the host wait for a transfer: Send and Receive enqueue
// the operation on the channel's own CUDA stream and return. A receiver gets
// the tensor at once with an event that fires when its bytes are there (the
// compute stream waits for it on the device); a sender's tensor is kept until
// it is sent. The owning thread calls Progress() while operations are in
// flight: it retires finished ones and notices a failed communicator or an
// operation past its deadline, which breaks the channel (status() says why)
// and aborts the communicator, so that nothing waits on it forever.
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

// Thread-compatible: one thread (the owner) sends (rank 0) or receives
// (rank 1) on a channel and calls Progress(); Abort() and status() may come
// from any thread.
class NcclChannel {
 public:
  using Clock = std::chrono::steady_clock;

  struct Received {
    at::Tensor tensor;
    c10::Event ready;  // recorded on the channel's stream after the receive
  };

  // Starts joining the communicator of `id` as `rank` on `device` and returns
  // at once (nonblocking); the first Send or Receive waits for it. `max_ctas`
  // bounds the thread blocks (so SMs) its kernels take; 0: NCCL's default.
  static StatusOr<std::unique_ptr<NcclChannel>> Join(const std::string& id, int rank, const at::Device& device,
                                                     int max_ctas, std::string label);
  virtual ~NcclChannel() = default;

  // Rank 0: enqueues sending `t` (contiguous, on the channel's device) after
  // `ready` (if any) on the channel's stream; `t` is kept until it is sent.
  // It must be sent by `deadline` (see Progress). An error means the channel
  // is broken.
  virtual Status Send(const at::Tensor& t, const c10::Event* ready, Clock::time_point deadline) = 0;
  // Rank 1: enqueues receiving the next tensor, of `shape` and `dtype`, into
  // a new tensor on the channel's device. Its memory comes from the channel's
  // stream; a reader on another stream waits for `ready` and records its
  // stream on the tensor (Tensor::record_stream) before the tensor is freed.
  virtual StatusOr<Received> Receive(at::IntArrayRef shape, at::ScalarType dtype, Clock::time_point deadline) = 0;
  // Waits until the communicator is up (both ranks joined), until
  // `deadline`; an error breaks the channel as in Progress.
  virtual Status WaitReady(Clock::time_point deadline) = 0;
  // Retires finished operations. An error when the communicator failed or an
  // operation is past its deadline: the channel is broken and aborted.
  virtual Status Progress() = 0;
  // Whether no operation is in flight.
  virtual bool Idle() const = 0;
  // OK while the channel works; why it broke otherwise. Any thread. Set
  // before the communicator is aborted: whoever sees an operation end (an
  // abort ends it too) and then reads OK here knows that it really ended.
  virtual Status status() const = 0;
  // Makes operations in flight and later ones fail; any thread. The owner's
  // next call aborts the communicator (so does the destructor).
  virtual void Abort() = 0;
};

}  // namespace conveyor
