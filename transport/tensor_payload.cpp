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

}  // namespace

std::unique_ptr<Payload> MakeTensorPayload(const at::Tensor& t) {
  at::Tensor c = t.detach().contiguous();
  std::optional<c10::Event> ready = RecordOnCurrentStream(c);
  return std::make_unique<TensorPayload>(std::move(c), std::move(ready));
}

at::Tensor TakeTensor(Frame& frame, const at::Device& device) {
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
