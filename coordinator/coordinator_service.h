// gRPC adapter of the Coordinator (the job API the CLI calls).
#pragma once

#include <string>
#include <utility>

#include "conveyor.grpc.pb.h"
#include "coordinator/coordinator.h"

namespace conveyor {

// With a non-empty `auth_token`, SubmitJob, CancelJob and ResumeJob (the calls
// that change something) require "authorization: Bearer AUTH_TOKEN" and answer
// UNAUTHENTICATED otherwise; the read-only calls stay open.
class CoordinatorService final : public v1::Coordinator::Service {
 public:
  explicit CoordinatorService(Coordinator* coordinator, std::string auth_token = "")
      : coordinator_(coordinator), auth_token_(std::move(auth_token)) {}

  grpc::Status SubmitJob(grpc::ServerContext*, const v1::SubmitJobRequest* req, v1::SubmitJobReply* reply) override;
  grpc::Status GetJob(grpc::ServerContext*, const v1::GetJobRequest* req, v1::JobStatus* reply) override;
  grpc::Status ListJobs(grpc::ServerContext*, const v1::ListJobsRequest* req, v1::ListJobsReply* reply) override;
  grpc::Status CancelJob(grpc::ServerContext*, const v1::JobRef* req, v1::JobStatus* reply) override;
  grpc::Status ResumeJob(grpc::ServerContext*, const v1::JobRef* req, v1::JobStatus* reply) override;
  grpc::Status WatchJob(grpc::ServerContext* ctx, const v1::GetJobRequest* req,
                        grpc::ServerWriter<v1::JobStatus>* writer) override;
  grpc::Status GetTrace(grpc::ServerContext*, const v1::GetTraceRequest* req, v1::StepTrace* reply) override;
  grpc::Status ListStages(grpc::ServerContext*, const v1::Empty*, v1::ListStagesReply* reply) override;
  grpc::Status GetCurves(grpc::ServerContext*, const v1::GetCurvesRequest* req, v1::Curves* reply) override;

 private:
  Coordinator* coordinator_;  // not owned
  const std::string auth_token_;
};

}  // namespace conveyor
