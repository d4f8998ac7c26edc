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

#define CONVEYOR_STAGE_RPC(Name, Request, Reply, Thread, How) \
  grpc::Status Name(grpc::ServerContext*, const Request* request, Reply* reply) override;
  CONVEYOR_STAGE_CONTROL_OPS(CONVEYOR_STAGE_RPC)
#undef CONVEYOR_STAGE_RPC

 private:
  Stage* stage_;  // not owned
};

}  // namespace conveyor
