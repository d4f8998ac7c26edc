// How the coordinator talks to one stage. GrpcStageClient calls a stage
// server; tests substitute an in-process client over a Stage.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "conveyor.pb.h"

namespace conveyor {

// Thread-safe. Every call returns by its deadline.
class StageClient {
 public:
  virtual ~StageClient() = default;
  virtual const std::string& address() const = 0;
  virtual StatusOr<v1::StageInfo> GetInfo(double timeout_s) = 0;
  virtual StatusOr<v1::ProfileReply> Profile(const v1::ProfileRequest& req, double timeout_s) = 0;
  virtual StatusOr<v1::ProbeReply> Probe(const v1::ProbeRequest& req, double timeout_s) = 0;
  virtual StatusOr<v1::ConfigureReply> Configure(const v1::StageAssignment& req, double timeout_s) = 0;
  virtual StatusOr<v1::LinkSetup> PrepareLink(const v1::JobRef& req, double timeout_s) = 0;
  virtual StatusOr<v1::ConnectReply> Connect(const v1::JobRef& req, double timeout_s) = 0;
  virtual StatusOr<v1::RunStepReply> RunStep(const v1::RunStepRequest& req, double timeout_s) = 0;
  virtual StatusOr<v1::DigestReply> GetDigest(const v1::JobRef& req, double timeout_s) = 0;
  virtual Status Abort(const v1::AbortRequest& req, double timeout_s) = 0;
  virtual Status Release(const v1::JobRef& req, double timeout_s) = 0;
};

std::unique_ptr<StageClient> MakeGrpcStageClient(const std::string& address);

}  // namespace conveyor
