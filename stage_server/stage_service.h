// The gRPC adapter of a Stage: StageControl (unary calls from the
// coordinator). Thin: no logic beyond status conversion. The neighbours'
// streams arrive at transport/grpc/stage_data_service.h.
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

}  // namespace conveyor
