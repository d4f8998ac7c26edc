// The chunked stream's framing: messages written the way GrpcTransport writes
// them parse back (also split across buffers anywhere), frames reassemble
// into the inbox byte for byte, and corrupt or oversized input is refused
// with the reason.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>

#include "transport/grpc/chunk_codec.h"
#include "transport/grpc/chunk_receiver.h"
#include "transport/inbox.h"
#include "transport/tensor_payload.h"

namespace conveyor {
namespace {

using ::testing::HasSubstr;

v1::TensorFrame Header(std::vector<int64_t> shape) {
  v1::TensorFrame h;
  h.set_job_id("job-1");
  h.set_phase(v1::PHASE_TRAIN);
  h.set_step(0);
  h.set_kind(v1::FRAME_ACTIVATION);
  h.set_chunk(1);
  h.mutable_tensor()->set_dtype(v1::DTYPE_FLOAT32);
  for (int64_t d : shape) h.mutable_tensor()->add_shape(d);
  return h;
}

// The messages of one frame, each a byte string, `piece` bytes of data each.
std::vector<std::string> Messages(const v1::TensorFrame& h, const std::string& data, int64_t piece) {
  std::vector<std::string> out;
  const int64_t n = static_cast<int64_t>(data.size());
  for (int64_t off = 0; off == 0 || off < n; off += piece) {
    const int64_t len = std::min(piece, n - off);
    out.push_back(EncodeChunkPrefix(off == 0 ? &h : nullptr, off, off + len == n, len) + data.substr(off, len));
  }
  return out;
}

// One message as gRPC may hand it: split into buffers every `split` bytes.
std::vector<Span> Split(const std::string& m, std::size_t split) {
  std::vector<Span> spans;
  for (std::size_t at = 0; at < m.size(); at += split) spans.emplace_back(m.data() + at, std::min(split, m.size() - at));
  return spans;
}

// Stage 1 of 2 in step 0 of job-1, taking activations of `sample` values per
// sample into chunk 1.
void OpenForActivations(Inbox& inbox, int64_t sample, int max_micro_batches, int64_t max_micro_batch_size) {
  InboxExpectations e;
  e.job_id = "job-1";
  e.stage_index = 1;
  e.num_stages = 2;
  e.activation_shapes[1] = {sample};
  e.max_micro_batches = max_micro_batches;
  e.max_micro_batch_size = max_micro_batch_size;
  inbox.Open(e);
  inbox.BeginStep(v1::PHASE_TRAIN, 0);
}

TEST(Chunks, PrefixIsTheProtobufEncodingOfATensorChunk) {
  const v1::TensorFrame h = Header({2, 3});
  const std::string data(24, 'x');
  v1::TensorChunk parsed;
  ASSERT_TRUE(parsed.ParseFromString(EncodeChunkPrefix(&h, 8, true, 24) + data));
  EXPECT_EQ(parsed.header().job_id(), "job-1");
  EXPECT_EQ(parsed.offset(), 8);
  EXPECT_TRUE(parsed.last());
  EXPECT_EQ(parsed.data(), data);
}

TEST(Chunks, ParseAcrossAnySplitOfBuffers) {
  const v1::TensorFrame h = Header({2, 3});
  std::string data(24, '\0');
  for (int i = 0; i < 24; ++i) data[i] = static_cast<char>(i);
  const std::string m = EncodeChunkPrefix(&h, 0, true, 24) + data;
  for (std::size_t split : {1, 2, 5, 7, 64}) {
    auto c = ParseChunk(Split(m, split));
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_TRUE(c->has_header && c->last);
    std::string got;
    for (const Span& s : c->data) got.append(s.first, s.second);
    EXPECT_EQ(got, data) << "split " << split;
  }
}

TEST(Chunks, FramesReassembleIntoTheInbox) {
  Inbox inbox;
  OpenForActivations(inbox, 1000, 2, 4);
  ChunkReceiver receiver(&inbox, "cpu");
  at::Tensor t = at::randn({4, 1000});
  const std::string data(static_cast<const char*>(t.data_ptr()), 16000);
  for (int mb = 0; mb < 2; ++mb) {
    v1::TensorFrame h = Header({4, 1000});
    h.set_micro_batch(mb);
    for (const std::string& m : Messages(h, data, 3000)) ASSERT_TRUE(receiver.OnMessage(Split(m, 1024)).ok());
  }
  EXPECT_EQ(receiver.frames(), 2);
  for (int mb = 0; mb < 2; ++mb) {
    auto f = inbox.Take(v1::FRAME_ACTIVATION, 1, mb, Inbox::Clock::now());
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_TRUE(at::equal(TakeTensor(*f, at::kCPU), t));
  }
}

TEST(Chunks, CorruptOrOversizedInputIsRefusedWithTheReason) {
  const v1::TensorFrame h = Header({2, 3});
  const std::string data(24, 'x');
  struct Case {
    std::vector<std::string> messages;
    absl::StatusCode code;
    const char* reason;
  };
  v1::TensorFrame huge = Header({int64_t{1} << 30, int64_t{1} << 30});
  Case cases[] = {
      {{EncodeChunkPrefix(nullptr, 0, true, 24) + data}, absl::StatusCode::kInvalidArgument, "starts without its header"},
      {{EncodeChunkPrefix(&h, 0, false, 8) + data.substr(0, 8), EncodeChunkPrefix(nullptr, 16, true, 8) + data.substr(0, 8)},
       absl::StatusCode::kInvalidArgument, "offset 16 where 8 was next"},
      {{EncodeChunkPrefix(&h, 0, true, 16) + data.substr(0, 16)}, absl::StatusCode::kInvalidArgument, "ended after 16 of its 24"},
      {{EncodeChunkPrefix(&h, 0, false, 24) + data, EncodeChunkPrefix(nullptr, 24, true, 8) + data.substr(0, 8)},
       absl::StatusCode::kInvalidArgument, "past the frame's 24"},
      {{EncodeChunkPrefix(&h, 0, true, 24) + data.substr(0, 20)}, absl::StatusCode::kInvalidArgument, "truncated data"},
      {{EncodeChunkPrefix(&h, 0, true, kMaxChunkBytes + 1)}, absl::StatusCode::kResourceExhausted, "over the limit"},
      {{EncodeChunkPrefix(&huge, 0, true, 0)}, absl::StatusCode::kResourceExhausted, "over the limit"},
      {{std::string("\x0a\x05\xff\xff", 4)}, absl::StatusCode::kInvalidArgument, "truncated header"},
  };
  for (const Case& c : cases) {
    ChunkAssembler assembler;
    Status st;
    for (const std::string& m : c.messages) {
      auto chunk = ParseChunk(Split(m, 3));
      st = chunk.ok() ? assembler.Accept(*chunk) : chunk.status();
      if (!st.ok()) break;
    }
    EXPECT_EQ(st.code(), c.code) << st;
    EXPECT_THAT(std::string(st.message()), HasSubstr(c.reason));
  }
}

TEST(Chunks, AHeaderTheInboxRefusesIsRefusedBeforeItsBytes) {
  Inbox inbox;
  OpenForActivations(inbox, 3, 1, 2);
  ChunkReceiver receiver(&inbox, "cpu");
  v1::TensorFrame h = Header({2, 4});
  Status st = receiver.OnMessage(Split(EncodeChunkPrefix(&h, 0, false, 8) + std::string(8, 'x'), 64));
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("has shape [2, 4], expected [2, 3]"));
  h = Header({2, 3});
  h.set_job_id("job-2");
  ChunkReceiver fresh(&inbox, "cpu");  // an error ends a stream: a new one
  st = fresh.OnMessage(Split(EncodeChunkPrefix(&h, 0, true, 24) + std::string(24, 'x'), 64));
  EXPECT_TRUE(absl::IsFailedPrecondition(st)) << st;
}

}  // namespace
}  // namespace conveyor
