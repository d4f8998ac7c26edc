#include "cli/export.h"

#include <vector>

#include "common/files.h"
#include "common/net.h"
#include "common/wire.h"
#include "conveyor.grpc.pb.h"
#include "plan/job_spec.h"
#include "torch_format/wire_state_dict.h"

namespace conveyor::cli {
namespace {

// Why this job's weights cannot be read at all, before any stage is asked.
Status CheckExportable(const v1::JobStatus& job) {
  const std::string& id = job.job_id();
  if (WeightsKept(job)) return absl::OkStatus();
  switch (job.state()) {
    case v1::JOB_STATE_FAILED:
    case v1::JOB_STATE_CANCELLED:
      return absl::FailedPreconditionError("job " + id + " " + JobStateName(job.state()) +
                                           ": its stages dropped its weights when it ended (only a job that "
                                           "succeeded, or one still running, can be exported)");
    case v1::JOB_STATE_QUEUED:
      return absl::FailedPreconditionError("job " + id + " is queued: it has no weights yet");
    default:
      break;
  }
  if (job.stages_size() == 0)
    return absl::FailedPreconditionError("job " + id + " has no stages yet (it has not started)");
  return absl::OkStatus();
}

// What a failed call to a stage of `job_id` means to the user.
Status StageError(const Status& st, const std::string& job_id, int stage, const std::string& address) {
  const std::string which = "stage " + std::to_string(stage) + " (" + address + ")";
  switch (st.code()) {
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kNotFound:
      // The stage holds no job, or another one: its answer says which.
      return absl::FailedPreconditionError("the stages no longer hold " + job_id +
                                           " (another job ran since): use save: in the job file to keep a "
                                           "job's weights; " + which + " says: " + std::string(st.message()));
    case absl::StatusCode::kUnavailable:
      return absl::UnavailableError("cannot reach " + which + ": " +
                                    DescribeUnreachable(std::string(st.message())));
    default:
      return Annotate(st, which);
  }
}

StatusOr<v1::ParametersReply> GetParameters(const std::string& job_id, int stage, const std::string& address,
                                            double deadline_s) {
  auto stub = v1::StageControl::NewStub(MakeChannel(address));
  auto page = [&](const v1::JobRef& ref) -> StatusOr<v1::ParametersReply> {
    v1::ParametersReply reply;
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineAfter(deadline_s));
    Status st = FromGrpc(stub->GetParameters(&ctx, ref, &reply));
    if (!st.ok()) return StageError(st, job_id, stage, address);
    return reply;
  };
  return GatherParameters(job_id, page);
}

// The job's TorchScript archive with `parts`, built by its first stage.
StatusOr<std::string> BuildTorchScript(const v1::JobStatus& job, std::vector<v1::ParametersReply> parts,
                                       double deadline_s) {
  const std::string& address = job.stages(0).address();
  auto stub = v1::StageControl::NewStub(MakeChannel(address));
  v1::TorchScriptRequest req;
  req.set_job_id(job.job_id());
  for (auto& part : parts) *req.add_parts() = std::move(part);
  v1::TorchScriptReply reply;
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineAfter(deadline_s));
  Status st = FromGrpc(stub->ExportTorchScript(&ctx, req, &reply));
  if (!st.ok()) return StageError(st, job.job_id(), 0, address);
  return std::move(*reply.mutable_archive());
}

}  // namespace

bool WeightsKept(const v1::JobStatus& job) {
  // The digest is taken after the last step, just before save.path is
  // written: a job that failed after it failed at that write.
  return job.state() == v1::JOB_STATE_FAILED && !job.param_digest().empty() && job.stages_size() > 0;
}

StatusOr<ExportSummary> ExportWeights(const v1::JobStatus& job, const std::string& path, const std::string& format,
                                      double deadline_s) {
  CONVEYOR_RETURN_IF_ERROR(CheckExportable(job));
  std::vector<v1::ParametersReply> parts;
  ExportSummary summary;
  for (int s = 0; s < job.stages_size(); ++s) {
    if (job.stages(s).replica() > 0) continue;  // replicas hold replica 0's parameters
    CONVEYOR_ASSIGN_OR_RETURN(v1::ParametersReply part,
                              GetParameters(job.job_id(), s, job.stages(s).address(), deadline_s));
    for (const auto* list : {&part.parameters(), &part.buffers()}) {
      summary.tensors += list->size();
      for (const v1::NamedTensor& t : *list) summary.bytes += static_cast<int64_t>(t.tensor().data().size());
    }
    parts.push_back(std::move(part));
  }
  summary.stages = static_cast<int>(parts.size());
  if (format == "torchscript") {
    CONVEYOR_ASSIGN_OR_RETURN(std::string archive, BuildTorchScript(job, std::move(parts), deadline_s));
    CONVEYOR_RETURN_IF_ERROR(Annotate(WriteFileAtomically(path, archive), "--out"));
  } else {
    CONVEYOR_RETURN_IF_ERROR(Annotate(WriteWireStateDict(path, parts), "--out"));
  }
  return summary;
}

}  // namespace conveyor::cli
