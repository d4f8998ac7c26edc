// gRPC adapters of a Stage: StageControl (unary calls from the coordinator)
// and StageData (streams from the neighbours, read with the callback API and
// fed into the stage's Inbox). Thin: no logic beyond status conversion.
#pragma once

#include "conveyor.grpc.pb.h"
#include "stage_server/stage.h"

namespace conveyor {

class StageControlService final : public v1::StageControl::Service {
 public:
  explicit StageControlService(Stage* stage) : stage_(stage) {}

  grpc::Status Profile(grpc::ServerContext*, const v1::ProfileRequest* req, v1::ProfileReply* reply) override;
  grpc::Status Describe(grpc::ServerContext*, const v1::JobSpec* req, v1::DescribeReply* reply) override;
  grpc::Status Probe(grpc::ServerContext*, const v1::ProbeRequest* req, v1::ProbeReply* reply) override;
  grpc::Status Configure(grpc::ServerContext*, const v1::StageAssignment* req, v1::ConfigureReply* reply) override;
  grpc::Status PrepareLink(grpc::ServerContext*, const v1::JobRef* req, v1::LinkSetup* reply) override;
  grpc::Status Connect(grpc::ServerContext*, const v1::JobRef* req, v1::ConnectReply* reply) override;
  grpc::Status RunStep(grpc::ServerContext*, const v1::RunStepRequest* req, v1::RunStepReply* reply) override;
  grpc::Status GetDigest(grpc::ServerContext*, const v1::JobRef* req, v1::DigestReply* reply) override;
  grpc::Status GetParameters(grpc::ServerContext*, const v1::JobRef* req, v1::ParametersReply* reply) override;
  grpc::Status LoadCheckpoint(grpc::ServerContext*, const v1::LoadCheckpointRequest* req,
                              v1::LoadCheckpointReply* reply) override;
  grpc::Status Abort(grpc::ServerContext*, const v1::AbortRequest* req, v1::Empty* reply) override;
  grpc::Status Release(grpc::ServerContext*, const v1::JobRef* req, v1::Empty* reply) override;
  grpc::Status GetInfo(grpc::ServerContext*, const v1::Empty* req, v1::StageInfo* reply) override;

 private:
  Stage* stage_;  // not owned
};

// Push: protobuf frames. PushChunks: a raw method (gRPC's buffers, no
// protobuf parse of the bytes), read by a ChunkReceiver that assembles the
// tensors on `device`.
class StageDataService final : public v1::StageData::WithRawCallbackMethod_PushChunks<v1::StageData::CallbackService> {
 public:
  StageDataService(Inbox* inbox, std::string device) : inbox_(inbox), device_(std::move(device)) {}
  grpc::ServerReadReactor<v1::TensorFrame>* Push(grpc::CallbackServerContext* context,
                                                 v1::PushReply* reply) override;
  grpc::ServerReadReactor<grpc::ByteBuffer>* PushChunks(grpc::CallbackServerContext* context,
                                                        grpc::ByteBuffer* reply) override;

 private:
  Inbox* inbox_;  // not owned
  const std::string device_;
};

}  // namespace conveyor
