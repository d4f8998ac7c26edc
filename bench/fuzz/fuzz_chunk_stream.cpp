// libFuzzer target: what a stage does with the messages of a neighbour's
// chunked stream (StageData.PushChunks): parse each TensorChunk from gRPC's
// buffers (split into slices at places the input chooses), follow the frames
// chunk by chunk, and check each frame's header with the inbox before any room
// is made for its bytes. Input: messages, each a 2-byte little-endian length,
// one byte that says where to split it in two slices, then its bytes.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "transport/grpc/chunk_codec.h"
#include "bench/fuzz/fuzz_inbox.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  conveyor::Inbox inbox;
  conveyor::fuzz::OpenFuzzInbox(&inbox);
  conveyor::ChunkAssembler stream;
  const char* p = reinterpret_cast<const char*>(data);
  std::size_t left = size;
  while (left >= 3) {
    const std::size_t n = std::min<std::size_t>(left - 3, static_cast<unsigned char>(p[0]) | (static_cast<unsigned char>(p[1]) << 8));
    const std::size_t cut = n == 0 ? 0 : static_cast<unsigned char>(p[2]) % (n + 1);
    const char* msg = p + 3;
    std::vector<conveyor::Span> spans{{msg, cut}, {msg + cut, n - cut}};
    p += 3 + n;
    left -= 3 + n;
    auto chunk = conveyor::ParseChunk(spans);
    if (!chunk.ok()) return 0;  // the stream ends with that error
    std::size_t bytes = 0;
    for (const auto& s : chunk->data) bytes += s.second;
    if (static_cast<int64_t>(bytes) != chunk->data_bytes) __builtin_trap();  // the pieces add up
    if (!stream.Accept(*chunk).ok()) return 0;
    if (stream.begins() && !inbox.CheckHeader(stream.header(), stream.total()).ok()) return 0;
  }
  return 0;
}
