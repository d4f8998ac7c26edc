#include "stage_server/stage_service.h"

namespace conveyor {
namespace {

template <typename T>
grpc::Status ToReply(StatusOr<T> result, T* reply) {
  if (!result.ok()) return ToGrpc(result.status());
  *reply = std::move(*result);
  return grpc::Status::OK;
}

}  // namespace

// Every operation of proto/stage_control_ops.h: the Stage's reply, or its
// status as a gRPC status.
#define CONVEYOR_STAGE_RPC(Name, Request, Reply, Thread, How)                                         \
  grpc::Status StageControlService::Name(grpc::ServerContext*, const Request* request, Reply* reply) { \
    return ToReply(stage_->Name(*request), reply);                                                     \
  }
CONVEYOR_STAGE_CONTROL_OPS(CONVEYOR_STAGE_RPC)
#undef CONVEYOR_STAGE_RPC

}  // namespace conveyor
