// How the coordinator talks to one stage. GrpcStageClient calls a stage
// server; tests substitute an in-process client over a Stage.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "conveyor.pb.h"
#include "proto/stage_control_ops.h"

namespace conveyor {

// Thread-safe. Every call returns by its deadline. Calls wait for a connection
// that is coming up, but RunStep fails at once when the stage is unreachable.
class StageClient {
 public:
  virtual ~StageClient() = default;
  virtual const std::string& address() const = 0;
  // Every operation of proto/stage_control_ops.h, by its deadline.
#define CONVEYOR_STAGE_CLIENT_METHOD(Name, Request, Reply, Thread, How) \
  virtual StatusOr<Reply> Name(const Request& request, double timeout_s) = 0;
  CONVEYOR_STAGE_CONTROL_OPS(CONVEYOR_STAGE_CLIENT_METHOD)
#undef CONVEYOR_STAGE_CLIENT_METHOD
  StatusOr<v1::StageInfo> GetInfo(double timeout_s) { return GetInfo(v1::Empty(), timeout_s); }
  // GetInfo that fails at once when the stage cannot be reached (a refused
  // connection, an unknown host) instead of waiting for it.
  virtual StatusOr<v1::StageInfo> Ping(double timeout_s) { return GetInfo(v1::Empty(), timeout_s); }
  // Ends the RunStep calls in flight at once (they return CANCELLED), from any
  // thread: a step that failed elsewhere must not wait for a stage that is gone.
  virtual void CancelSteps() {}
  // Called when a job starts, from any thread: a client whose connection is
  // not up makes a new one, so that the stage's name is resolved again (a
  // pod restarted at another IP, a name that did not resolve before) and no
  // reconnect backoff left from earlier failures delays the job.
  virtual void Reconnect() {}
};

std::unique_ptr<StageClient> MakeGrpcStageClient(const std::string& address);

// Deadlines the coordinator gives its stage calls (gRPC decides them, in real
// time). Generous for steps: a step's own waits are bounded by stage_timeout
// on the stages, and a vanished stage breaks the call through keepalive long
// before this.
constexpr double kStepDeadlineS = 3600;
constexpr double kControlDeadlineS = 600;
constexpr double kAbortDeadlineS = 5;

// "stage N: " before a stage's error, unless the stage named itself already
// (stage servers do, for their own logs): a message names its stage once.
Status ForStage(const Status& st, int64_t stage);

}  // namespace conveyor
