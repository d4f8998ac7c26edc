#include "transport/grpc/chunk_receiver.h"

#include <ATen/ATen.h>

#include <cstring>

#include "transport/tensor_codec.h"
#include "transport/grpc/cuda_staging.h"
#include "transport/inbox.h"
#include "transport/tensor_payload.h"

namespace conveyor {

class ChunkReceiver::Impl {
 public:
  Impl(Inbox* inbox, const std::string& device) : inbox_(inbox), device_(device) {}

  Status OnMessage(const std::vector<Span>& spans) {
    CONVEYOR_ASSIGN_OR_RETURN(ChunkView chunk, ParseChunk(spans));
    CONVEYOR_RETURN_IF_ERROR(assembler_.Accept(chunk));
    const v1::TensorFrame& header = assembler_.header();
    if (assembler_.begins() && header.carrier() != v1::CARRIER_NCCL) CONVEYOR_RETURN_IF_ERROR(Begin(header));
    if (chunk.data_bytes > 0) CONVEYOR_RETURN_IF_ERROR(Copy(chunk));
    if (!assembler_.completes()) return absl::OkStatus();
    Frame frame;
    frame.header = header;
    if (header.carrier() != v1::CARRIER_NCCL) {
      if (staging_) {
        CONVEYOR_RETURN_IF_ERROR(staging_->Finish());
        staging_.reset();
      }
      frame.payload = std::make_unique<TensorPayload>(std::move(dst_));
      dst_ = at::Tensor();
    }
    ++frames_;
    return inbox_->Deliver(std::move(frame));
  }

  int64_t frames() const { return frames_; }

 private:
  // A frame starts: its header must pass the inbox's checks before any room
  // is made for its bytes.
  Status Begin(const v1::TensorFrame& header) {
    CONVEYOR_RETURN_IF_ERROR(inbox_->CheckHeader(header, assembler_.total()));
    std::vector<int64_t> shape(header.tensor().shape().begin(), header.tensor().shape().end());
    try {
      const auto options = at::TensorOptions().dtype(FromWireDType(header.tensor().dtype()));
      if (device_.is_cuda()) {
        dst_ = at::empty(shape, options.device(device_));
        CONVEYOR_ASSIGN_OR_RETURN(staging_, HostToDeviceCopy::Start(dst_));
      } else {
        dst_ = at::empty(shape, options);
      }
    } catch (const c10::Error& e) {
      return absl::ResourceExhaustedError(std::string("no room for a tensor of ") +
                                          std::to_string(assembler_.total()) + " bytes: " + e.what_without_backtrace());
    }
    return absl::OkStatus();
  }

  Status Copy(const ChunkView& chunk) {
    char* base = staging_ ? staging_->host() : static_cast<char*>(dst_.data_ptr());
    int64_t at = chunk.offset;
    for (const Span& piece : chunk.data) {
      std::memcpy(base + at, piece.first, piece.second);
      at += static_cast<int64_t>(piece.second);
    }
    if (staging_) return staging_->Commit(chunk.offset, chunk.data_bytes);
    return absl::OkStatus();
  }

  Inbox* inbox_;
  const at::Device device_;
  ChunkAssembler assembler_;
  at::Tensor dst_;
  std::unique_ptr<HostToDeviceCopy> staging_;
  int64_t frames_ = 0;
};

ChunkReceiver::ChunkReceiver(Inbox* inbox, const std::string& device) : impl_(std::make_unique<Impl>(inbox, device)) {}
ChunkReceiver::~ChunkReceiver() = default;
Status ChunkReceiver::OnMessage(const std::vector<Span>& spans) { return impl_->OnMessage(spans); }
int64_t ChunkReceiver::frames() const { return impl_->frames(); }

}  // namespace conveyor
