// The chunked stream's messages (TensorChunk in conveyor.proto), written and
// read without protobuf touching the tensor's bytes: a sender writes a small
// protobuf-encoded prefix and then the bytes straight from the tensor's
// memory; a receiver parses the prefix from gRPC's buffers and copies the
// bytes from there into the tensor it assembles. Torch-free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "conveyor.pb.h"

namespace conveyor {

// Bytes of tensor data per chunk a sender writes.
constexpr int64_t kChunkBytes = int64_t{4} << 20;
// Larger chunks are refused (RESOURCE_EXHAUSTED) before they are copied.
constexpr int64_t kMaxChunkBytes = int64_t{256} << 20;
// Larger frames are refused (RESOURCE_EXHAUSTED) before room is made for them.
constexpr int64_t kMaxFrameBytes = int64_t{64} << 30;

using Span = std::pair<const char*, std::size_t>;

// The encoding of a TensorChunk up to its data's bytes: header (if any),
// offset, last, then the data field's tag and length. The `data_bytes` bytes
// follow on the wire.
std::string EncodeChunkPrefix(const v1::TensorFrame* header, int64_t offset, bool last, int64_t data_bytes);

// One TensorChunk as read from a message's buffers.
struct ChunkView {
  bool has_header = false;
  v1::TensorFrame header;
  int64_t offset = 0;
  bool last = false;
  int64_t data_bytes = 0;
  std::vector<Span> data;  // the data's pieces, pointing into the message
};

// Parses a message held in `spans` (gRPC's slices, in order). INVALID_ARGUMENT
// for a malformed message, RESOURCE_EXHAUSTED for data over kMaxChunkBytes.
StatusOr<ChunkView> ParseChunk(const std::vector<Span>& spans);

// Bytes a tensor of this dtype and shape holds; RESOURCE_EXHAUSTED over
// kMaxFrameBytes, INVALID_ARGUMENT for an unknown dtype or a negative size.
StatusOr<int64_t> TensorBytes(const v1::Tensor& t);

// Follows one stream's frames chunk by chunk: a frame starts with a chunk that
// carries its header, its chunks' offsets follow each other, and the chunk
// marked last completes exactly the bytes its header's dtype and shape need
// (none for a header whose bytes travel over NCCL). Not thread-safe.
class ChunkAssembler {
 public:
  // Checks `chunk` against the stream so far. On success, begins() says
  // whether it started a frame (header() and total() are then new) and
  // completes() whether it ended one.
  Status Accept(const ChunkView& chunk);
  bool begins() const { return begins_; }
  bool completes() const { return completes_; }
  const v1::TensorFrame& header() const { return header_; }
  int64_t total() const { return total_; }
  // Whether a frame is under way (a stream that ends now ends mid-frame).
  bool in_frame() const { return in_frame_; }

 private:
  bool in_frame_ = false, begins_ = false, completes_ = false;
  v1::TensorFrame header_;
  int64_t total_ = 0, received_ = 0;
};

}  // namespace conveyor
