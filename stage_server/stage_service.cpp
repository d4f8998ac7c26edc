#include "stage_server/stage_service.h"

#include "common/metrics.h"
#include "stage_server/stage_metrics.h"

namespace conveyor {
namespace {

template <typename T>
grpc::Status ToReply(const char* method, StatusOr<T> result, T* reply) {
  if (!result.ok()) {
    metrics::CountRpcError(method, result.status());
    return ToGrpc(result.status());
  }
  *reply = std::move(*result);
  return grpc::Status::OK;
}

// What an operation adds to the stage server's metrics: nothing, but a step.
template <typename Request, typename Reply>
StatusOr<Reply> Observed(Stage*, const Request&, StatusOr<Reply> reply) {
  return reply;
}
StatusOr<v1::RunStepReply> Observed(Stage* stage, const v1::RunStepRequest& req, StatusOr<v1::RunStepReply> reply) {
  if (reply.ok()) {
    const v1::StageInfo info = stage->Info();
    RecordStageStep(info.stage_index(), info.replica(), info.device(), req, *reply);
  }
  return reply;
}

}  // namespace

// Every operation of proto/stage_control_ops.h: the Stage's reply, or its
// status as a gRPC status.
#define CONVEYOR_STAGE_RPC(Name, Request, Reply, Thread, How)                                         \
  grpc::Status StageControlService::Name(grpc::ServerContext*, const Request* request, Reply* reply) { \
    return ToReply("StageControl/" #Name, Observed(stage_, *request, stage_->Name(*request)), reply);  \
  }
CONVEYOR_STAGE_CONTROL_OPS(CONVEYOR_STAGE_RPC)
#undef CONVEYOR_STAGE_RPC

}  // namespace conveyor
