#include "stage_server/stage_service.h"

namespace conveyor {
namespace {

template <typename T>
grpc::Status Reply(StatusOr<T> result, T* reply) {
  if (!result.ok()) return ToGrpc(result.status());
  *reply = std::move(*result);
  return grpc::Status::OK;
}

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

}  // namespace conveyor
