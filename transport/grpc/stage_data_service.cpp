#include "transport/grpc/stage_data_service.h"

#include <vector>

#include "common/logging.h"
#include "transport/grpc/chunk_receiver.h"

namespace conveyor {
namespace {

// Reads one neighbour's stream frame by frame into the inbox. The first bad
// frame ends the stream with its status (the sender's link reports it).
class PushReader final : public grpc::ServerReadReactor<v1::TensorFrame> {
 public:
  PushReader(Inbox* inbox, v1::PushReply* reply) : inbox_(inbox), reply_(reply) { StartRead(&frame_); }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the sender closed its side, or the call broke
      Finish(grpc::Status::OK);
      return;
    }
    Status st = inbox_->Deliver(std::move(frame_));
    if (!st.ok()) {
      LOG_WARN("refused a tensor: ", st.message());
      Finish(ToGrpc(st));
      return;
    }
    reply_->set_frames(reply_->frames() + 1);
    frame_.Clear();
    StartRead(&frame_);
  }
  void OnDone() override { delete this; }
  void OnCancel() override {}

 private:
  Inbox* inbox_;
  v1::PushReply* reply_;
  v1::TensorFrame frame_;
};

// Reads one neighbour's chunked stream into the inbox. The first bad chunk
// or refused frame ends the stream with its status.
class ChunkReader final : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  ChunkReader(Inbox* inbox, const std::string& device, grpc::ByteBuffer* reply)
      : receiver_(inbox, device), reply_(reply) {
    StartRead(&buffer_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the sender closed its side, or the call broke
      v1::PushReply reply;
      reply.set_frames(receiver_.frames());
      grpc::Slice slice(reply.SerializeAsString());
      *reply_ = grpc::ByteBuffer(&slice, 1);
      Finish(grpc::Status::OK);
      return;
    }
    std::vector<grpc::Slice> slices;
    Status st = buffer_.Dump(&slices).ok() ? absl::OkStatus() : absl::InvalidArgumentError("unreadable message");
    if (st.ok()) {
      std::vector<Span> spans;
      spans.reserve(slices.size());
      for (const grpc::Slice& s : slices) spans.emplace_back(reinterpret_cast<const char*>(s.begin()), s.size());
      st = receiver_.OnMessage(spans);
    }
    if (!st.ok()) {
      LOG_WARN("refused a tensor: ", st.message());
      Finish(ToGrpc(st));
      return;
    }
    buffer_.Clear();
    StartRead(&buffer_);
  }
  void OnDone() override { delete this; }
  void OnCancel() override {}

 private:
  ChunkReceiver receiver_;
  grpc::ByteBuffer* reply_;
  grpc::ByteBuffer buffer_;
};

}  // namespace

grpc::ServerReadReactor<v1::TensorFrame>* StageDataService::Push(grpc::CallbackServerContext*,
                                                                 v1::PushReply* reply) {
  return new PushReader(inbox_, reply);
}

grpc::ServerReadReactor<grpc::ByteBuffer>* StageDataService::PushChunks(grpc::CallbackServerContext*,
                                                                        grpc::ByteBuffer* reply) {
  return new ChunkReader(inbox_, device_, reply);
}

}  // namespace conveyor
