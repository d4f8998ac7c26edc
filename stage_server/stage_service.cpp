#include "stage_server/stage_service.h"

#include "common/logging.h"
#include "stage_server/chunk_receiver.h"
#include "stage_server/inbox.h"

namespace conveyor {
namespace {

template <typename T>
grpc::Status Reply(StatusOr<T> result, T* reply) {
  if (!result.ok()) return ToGrpc(result.status());
  *reply = std::move(*result);
  return grpc::Status::OK;
}

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

grpc::Status StageControlService::PrepareLink(grpc::ServerContext*, const v1::JobRef* req, v1::LinkSetup* reply) {
  return Reply(stage_->PrepareLink(*req), reply);
}

grpc::Status StageControlService::Describe(grpc::ServerContext*, const v1::JobSpec* req, v1::DescribeReply* reply) {
  return Reply(stage_->Describe(*req), reply);
}

grpc::Status StageControlService::Profile(grpc::ServerContext*, const v1::ProfileRequest* req,
                                          v1::ProfileReply* reply) {
  return Reply(stage_->Profile(*req), reply);
}
grpc::Status StageControlService::Probe(grpc::ServerContext*, const v1::ProbeRequest* req, v1::ProbeReply* reply) {
  return Reply(stage_->Probe(*req), reply);
}
grpc::Status StageControlService::Configure(grpc::ServerContext*, const v1::StageAssignment* req,
                                            v1::ConfigureReply* reply) {
  return Reply(stage_->Configure(*req), reply);
}
grpc::Status StageControlService::Connect(grpc::ServerContext*, const v1::JobRef* req, v1::ConnectReply* reply) {
  return Reply(stage_->Connect(*req), reply);
}
grpc::Status StageControlService::RunStep(grpc::ServerContext*, const v1::RunStepRequest* req,
                                          v1::RunStepReply* reply) {
  return Reply(stage_->RunStep(*req), reply);
}
grpc::Status StageControlService::GetDigest(grpc::ServerContext*, const v1::JobRef* req, v1::DigestReply* reply) {
  return Reply(stage_->GetDigest(*req), reply);
}
grpc::Status StageControlService::GetParameters(grpc::ServerContext*, const v1::JobRef* req,
                                                v1::ParametersReply* reply) {
  return Reply(stage_->GetParameters(*req), reply);
}
grpc::Status StageControlService::LoadCheckpoint(grpc::ServerContext*, const v1::LoadCheckpointRequest* req,
                                                 v1::LoadCheckpointReply* reply) {
  return Reply(stage_->LoadCheckpoint(*req), reply);
}
grpc::Status StageControlService::Abort(grpc::ServerContext*, const v1::AbortRequest* req, v1::Empty*) {
  return ToGrpc(stage_->Abort(*req));
}
grpc::Status StageControlService::Release(grpc::ServerContext*, const v1::JobRef* req, v1::Empty*) {
  return ToGrpc(stage_->Release(*req));
}
grpc::Status StageControlService::GetInfo(grpc::ServerContext*, const v1::Empty*, v1::StageInfo* reply) {
  *reply = stage_->Info();
  return grpc::Status::OK;
}

grpc::ServerReadReactor<v1::TensorFrame>* StageDataService::Push(grpc::CallbackServerContext*,
                                                                 v1::PushReply* reply) {
  return new PushReader(inbox_, reply);
}

grpc::ServerReadReactor<grpc::ByteBuffer>* StageDataService::PushChunks(grpc::CallbackServerContext*,
                                                                        grpc::ByteBuffer* reply) {
  return new ChunkReader(inbox_, device_, reply);
}

}  // namespace conveyor
