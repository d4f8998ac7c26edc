// How the coordinator talks to one stage. GrpcStageClient calls a stage
// server; tests substitute an in-process client over a Stage.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "conveyor.pb.h"

namespace conveyor {

// Thread-safe. Every call returns by its deadline. Calls wait for a connection
// that is coming up, but RunStep fails at once when the stage is unreachable.
class StageClient {
 public:
  virtual ~StageClient() = default;
  virtual const std::string& address() const = 0;
  virtual StatusOr<v1::StageInfo> GetInfo(double timeout_s) = 0;
  // GetInfo that fails at once when the stage cannot be reached (a refused
  // connection, an unknown host) instead of waiting for it.
  virtual StatusOr<v1::StageInfo> Ping(double timeout_s) { return GetInfo(timeout_s); }
  virtual StatusOr<v1::ProfileReply> Profile(const v1::ProfileRequest& req, double timeout_s) = 0;
  virtual StatusOr<v1::DescribeReply> Describe(const v1::JobSpec& req, double timeout_s) = 0;
  virtual StatusOr<v1::ProbeReply> Probe(const v1::ProbeRequest& req, double timeout_s) = 0;
  virtual StatusOr<v1::ConfigureReply> Configure(const v1::StageAssignment& req, double timeout_s) = 0;
  virtual StatusOr<v1::LinkSetup> PrepareLink(const v1::JobRef& req, double timeout_s) = 0;
  virtual StatusOr<v1::ConnectReply> Connect(const v1::JobRef& req, double timeout_s) = 0;
  virtual StatusOr<v1::RunStepReply> RunStep(const v1::RunStepRequest& req, double timeout_s) = 0;
  virtual StatusOr<v1::DigestReply> GetDigest(const v1::JobRef& req, double timeout_s) = 0;
  virtual StatusOr<v1::ParametersReply> GetParameters(const v1::JobRef& req, double timeout_s) = 0;
  virtual StatusOr<v1::LoadCheckpointReply> LoadCheckpoint(const v1::LoadCheckpointRequest& req,
                                                            double timeout_s) = 0;
  virtual Status Abort(const v1::AbortRequest& req, double timeout_s) = 0;
  // Ends the RunStep calls in flight at once (they return CANCELLED), from any
  // thread: a step that failed elsewhere must not wait for a stage that is gone.
  virtual void CancelSteps() {}
  virtual Status Release(const v1::JobRef& req, double timeout_s) = 0;
};

std::unique_ptr<StageClient> MakeGrpcStageClient(const std::string& address);

}  // namespace conveyor
