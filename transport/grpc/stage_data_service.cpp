#include "transport/grpc/stage_data_service.h"

#include <grpcpp/impl/codegen/proto_utils.h>
#include <grpcpp/impl/rpc_service_method.h>
#include <grpcpp/support/method_handler.h>

#include <vector>

#include "common/logging.h"
#include "transport/grpc/chunk_receiver.h"

namespace conveyor {
namespace {

// A client-streaming method of StageData, `path` as the generated stub
// names it (the link tests send through that stub), served by `method`.
template <typename Request, typename Reply>
grpc::internal::RpcServiceMethod* ClientStreaming(
    const char* path, StageDataService* service,
    grpc::Status (StageDataService::*method)(grpc::ServerReader<Request>*, Reply*)) {
  return new grpc::internal::RpcServiceMethod(
      path, grpc::internal::RpcMethod::CLIENT_STREAMING,
      new grpc::internal::ClientStreamingHandler<StageDataService, Request, Reply>(
          [method](StageDataService* s, grpc::ServerContext*, grpc::ServerReader<Request>* reader, Reply* reply) {
            return (s->*method)(reader, reply);
          },
          service));
}

}  // namespace

StageDataService::StageDataService(Inbox* inbox, std::string device) : inbox_(inbox), device_(std::move(device)) {
  AddMethod(ClientStreaming("/conveyor.v1.StageData/Push", this, &StageDataService::Push));
  AddMethod(ClientStreaming("/conveyor.v1.StageData/PushChunks", this, &StageDataService::PushChunks));
}

// One neighbour's stream, frame by frame into the inbox, until the sender
// closes its side or the call breaks. The first bad frame ends the stream
// with its status (the sender's link reports it).
grpc::Status StageDataService::Push(grpc::ServerReader<v1::TensorFrame>* reader, v1::PushReply* reply) {
  v1::TensorFrame frame;
  while (reader->Read(&frame)) {
    Status st = inbox_->Deliver(std::move(frame));
    if (!st.ok()) {
      LOG_WARN("refused a tensor: ", st.message());
      return ToGrpc(st);
    }
    reply->set_frames(reply->frames() + 1);
    frame.Clear();
  }
  return grpc::Status::OK;
}

// One neighbour's chunked stream into the inbox. The first bad chunk or
// refused frame ends the stream with its status.
grpc::Status StageDataService::PushChunks(grpc::ServerReader<grpc::ByteBuffer>* reader, grpc::ByteBuffer* reply) {
  ChunkReceiver receiver(inbox_, device_);
  grpc::ByteBuffer buffer;
  std::vector<grpc::Slice> slices;
  std::vector<Span> spans;
  while (reader->Read(&buffer)) {
    slices.clear();
    Status st = buffer.Dump(&slices).ok() ? absl::OkStatus() : absl::InvalidArgumentError("unreadable message");
    if (st.ok()) {
      spans.clear();
      for (const grpc::Slice& s : slices) spans.emplace_back(reinterpret_cast<const char*>(s.begin()), s.size());
      st = receiver.OnMessage(spans);
    }
    if (!st.ok()) {
      LOG_WARN("refused a tensor: ", st.message());
      return ToGrpc(st);
    }
    buffer.Clear();
  }
  v1::PushReply done;
  done.set_frames(receiver.frames());
  grpc::Slice slice(done.SerializeAsString());
  *reply = grpc::ByteBuffer(&slice, 1);
  return grpc::Status::OK;
}

}  // namespace conveyor
