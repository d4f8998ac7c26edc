#include "transport/tensor_payload.h"

#include <ATen/ATen.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <string>

#include "transport/tensor_codec.h"

namespace conveyor {
namespace {

c10::Stream CurrentStream(const at::Device& device) {
  return c10::impl::VirtualGuardImpl(device.type()).getStream(device);
}

std::optional<c10::Event> RecordOnCurrentStream(const at::Tensor& t) {
  if (t.device().is_cpu()) return std::nullopt;
  std::optional<c10::Event> ready;
  ready.emplace(t.device().type());
  ready->record(CurrentStream(t.device()));
  return ready;
}

// The frame's tensor as its header describes it: bytes in channels-last order
// (any contiguous tensor of them: the sender's [N, H, W, C] view, or a buffer
// of the header's shape they were received into) are viewed as the
// [N, C, H, W] tensor with channels-last strides they are.
at::Tensor AsSent(const at::Tensor& t, const v1::Tensor& h) {
  if (!h.channels_last() || h.shape_size() != 4) return t;
  return t.view({h.shape(0), h.shape(2), h.shape(3), h.shape(1)}).permute({0, 3, 1, 2});
}

// The frame's bytes as a tensor of the header's shape (or the sender's own
// view of them), on `device`.
at::Tensor Bytes(Frame& frame, const at::Device& device) {
  if (auto* tp = dynamic_cast<TensorPayload*>(frame.payload.get())) {
    at::Tensor t = tp->tensor();
    if (tp->ready()) {
      const c10::Stream stream = CurrentStream(t.device());
      tp->ready()->block(stream);
      // Made on another stream (an NCCL receive's): its memory must not be
      // reused before the work queued here on it is done.
      if (t.is_cuda()) t.record_stream(stream);
    }
    return t.device() == device ? t : t.to(device);
  }
  auto* host = dynamic_cast<HostPayload*>(frame.payload.get());
  auto* bytes = new std::string(std::move(host->data()));
  const v1::Tensor& h = frame.header.tensor();
  std::vector<int64_t> shape(h.shape().begin(), h.shape().end());
  at::Tensor t = at::from_blob(
      bytes->data(), shape, [bytes](void*) { delete bytes; }, at::TensorOptions().dtype(FromWireDType(h.dtype())));
  return t.to(device);
}

}  // namespace

bool SendsChannelsLast(const at::Tensor& t) {
  return t.dim() == 4 && !t.is_contiguous() && t.is_contiguous(at::MemoryFormat::ChannelsLast);
}

std::unique_ptr<Payload> MakeTensorPayload(const at::Tensor& t) {
  // A channels-last tensor goes as its bytes are (N, H, W, C): a view, no copy.
  at::Tensor c = SendsChannelsLast(t) ? t.detach().permute({0, 2, 3, 1}) : t.detach().contiguous();
  std::optional<c10::Event> ready = RecordOnCurrentStream(c);
  return std::make_unique<TensorPayload>(std::move(c), std::move(ready));
}

at::Tensor TakeTensor(Frame& frame, const at::Device& device) {
  const at::Tensor t = Bytes(frame, device);
  return AsSent(t, frame.header.tensor());
}

std::unique_ptr<Payload> CopyPayload(const Payload& p) {
  if (auto* tp = dynamic_cast<const TensorPayload*>(&p)) {
    const at::Tensor& t = tp->tensor();
    if (tp->ready()) tp->ready()->block(CurrentStream(t.device()));
    at::Tensor copy = t.clone();
    std::optional<c10::Event> ready = RecordOnCurrentStream(copy);
    return std::make_unique<TensorPayload>(std::move(copy), std::move(ready));
  }
  auto& host = dynamic_cast<const HostPayload&>(p);
  return std::make_unique<HostPayload>(host.data());
}

}  // namespace conveyor
