#include "coordinator/coordinator_service.h"

#include "plan/job_spec.h"
#include "common/metrics.h"
#include "common/security.h"

namespace conveyor {
namespace {

// The RPC's error, counted in conveyor_rpc_errors_total.
grpc::Status Failed(const char* method, const Status& status) {
  metrics::CountRpcError(method, status);
  return ToGrpc(status);
}

}  // namespace

grpc::Status CoordinatorService::SubmitJob(grpc::ServerContext* ctx, const v1::SubmitJobRequest* req,
                                           v1::SubmitJobReply* reply) {
  if (Status auth = CheckBearerToken(ctx->client_metadata(), auth_token_); !auth.ok()) return Failed("Coordinator/SubmitJob", auth);
  auto id = coordinator_->Submit(req->job_yaml());
  if (!id.ok()) return Failed("Coordinator/SubmitJob", id.status());
  reply->set_job_id(*id);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::GetJob(grpc::ServerContext*, const v1::GetJobRequest* req, v1::JobStatus* reply) {
  auto status = coordinator_->Get(req->job_id(), req->omit_losses());
  if (!status.ok()) return Failed("Coordinator/GetJob", status.status());
  *reply = std::move(*status);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::ListJobs(grpc::ServerContext*, const v1::ListJobsRequest* req,
                                          v1::ListJobsReply* reply) {
  auto jobs = coordinator_->List(req->with_losses());
  if (!jobs.ok()) return Failed("Coordinator/ListJobs", jobs.status());
  for (auto& j : *jobs) *reply->add_jobs() = std::move(j);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::CancelJob(grpc::ServerContext* ctx, const v1::JobRef* req, v1::JobStatus* reply) {
  if (Status auth = CheckBearerToken(ctx->client_metadata(), auth_token_); !auth.ok()) return Failed("Coordinator/CancelJob", auth);
  auto status = coordinator_->Cancel(req->job_id());
  if (!status.ok()) return Failed("Coordinator/CancelJob", status.status());
  *reply = std::move(*status);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::ResumeJob(grpc::ServerContext* ctx, const v1::JobRef* req, v1::JobStatus* reply) {
  if (Status auth = CheckBearerToken(ctx->client_metadata(), auth_token_); !auth.ok()) return Failed("Coordinator/ResumeJob", auth);
  auto status = coordinator_->Resume(req->job_id(), {req->sets().begin(), req->sets().end()});
  if (!status.ok()) return Failed("Coordinator/ResumeJob", status.status());
  *reply = std::move(*status);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::GetTrace(grpc::ServerContext*, const v1::GetTraceRequest* req,
                                          v1::StepTrace* reply) {
  auto trace = coordinator_->GetTrace(req->job_id(), req->step());
  if (!trace.ok()) return Failed("Coordinator/GetTrace", trace.status());
  *reply = std::move(*trace);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::ListStages(grpc::ServerContext*, const v1::Empty*, v1::ListStagesReply* reply) {
  for (auto& h : coordinator_->ListStages()) *reply->add_stages() = std::move(h);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::GetCurves(grpc::ServerContext*, const v1::GetCurvesRequest* req, v1::Curves* reply) {
  auto curves = coordinator_->GetCurves(req->job_id(), req->after_step());
  if (!curves.ok()) return Failed("Coordinator/GetCurves", curves.status());
  *reply = std::move(*curves);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::WatchJob(grpc::ServerContext* ctx, const v1::GetJobRequest* req,
                                          grpc::ServerWriter<v1::JobStatus>* writer) {
  uint64_t version = 0;
  auto status = coordinator_->Get(req->job_id(), req->omit_losses());
  while (status.ok()) {
    if (!writer->Write(*status)) return grpc::Status(grpc::StatusCode::CANCELLED, "watcher went away");
    if (IsTerminal(status->state())) return grpc::Status::OK;
    // Wake at least once a second to notice a cancelled call.
    do {
      if (ctx->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "watcher went away");
      uint64_t before = version;
      status = coordinator_->Watch(req->job_id(), &version, coordinator_->clock().After(1), req->omit_losses());
      if (version != before) break;
    } while (status.ok());
  }
  return Failed("Coordinator/WatchJob", status.status());
}

}  // namespace conveyor
