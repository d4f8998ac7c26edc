// LibTorch tensors as frame payloads (frame.h): what the stage hands its
// transport, and what receivers deliver to its inbox.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Event.h>

#include <memory>
#include <optional>

#include "transport/frame.h"

namespace conveyor {

// A contiguous tensor on any device. `ready`, when set, was recorded on the
// stream that produced the tensor: a reader on another stream first makes its
// stream wait for it (on the device, not the host).
class TensorPayload final : public Payload {
 public:
  explicit TensorPayload(at::Tensor tensor, std::optional<c10::Event> ready = std::nullopt)
      : tensor_(std::move(tensor)), ready_(std::move(ready)) {}
  int64_t bytes() const override { return tensor_.defined() ? tensor_.numel() * tensor_.element_size() : 0; }
  const at::Tensor& tensor() const { return tensor_; }
  const c10::Event* ready() const { return ready_ ? &*ready_ : nullptr; }

 private:
  at::Tensor tensor_;
  std::optional<c10::Event> ready_;
};

// Whether `t` is a 4-D tensor held channels-last (and not also contiguous):
// it travels in that order, and its frame's header says so
// (Tensor.channels_last), so that no stage converts it to NCHW and back.
bool SendsChannelsLast(const at::Tensor& t);

// What the stage sends: `t` detached and contiguous (a channels-last `t` as
// the contiguous [N, H, W, C] view of its bytes), and on a GPU an event
// recorded on its device's current stream.
std::unique_ptr<Payload> MakeTensorPayload(const at::Tensor& t);

// The tensor of a received, checked frame, on `device`: a TensorPayload's
// (its ready event waited for on the current stream, which is recorded on
// the tensor for the caching allocator), or one over a
// HostPayload's bytes; moved to `device` when it is elsewhere. A header with
// channels_last gives the [N, C, H, W] tensor with channels-last strides.
at::Tensor TakeTensor(Frame& frame, const at::Device& device);

// A payload with the same bytes and no memory shared with `p`.
std::unique_ptr<Payload> CopyPayload(const Payload& p);

}  // namespace conveyor
