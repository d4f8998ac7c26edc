#include "stage_server/checkpoint_peers.h"

#include <grpcpp/client_context.h>

#include "common/net.h"
#include "conveyor.grpc.pb.h"
#include "stage_server/checkpoint.h"

namespace conveyor {
namespace {

std::unique_ptr<v1::StageControl::Stub> StubFor(const std::string& address) {
  return v1::StageControl::NewStub(MakeChannel(address));
}

// One call's context: a deadline, and a wait for a server still connecting.
void Prepare(grpc::ClientContext* context, double timeout_s) {
  context->set_deadline(DeadlineAfter(timeout_s));
  context->set_wait_for_ready(true);
}

v1::CheckpointFileRequest RequestFor(const CheckpointFileId& id) {
  v1::CheckpointFileRequest req;
  req.set_job_id(id.job_id);
  req.set_stage(id.stage);
  req.set_step(id.step);
  return req;
}

}  // namespace

std::string CheckpointFileId::Describe() const {
  return job_id + " stage " + std::to_string(stage) + " step " + std::to_string(step);
}

Status SendCheckpointCopy(const std::string& address, const CheckpointFileId& id, const std::string& file, int keep,
                          double timeout_s) {
  auto stub = StubFor(address);
  const int64_t total = static_cast<int64_t>(file.size());
  int64_t offset = 0;
  do {
    v1::CheckpointFilePart part;
    part.set_job_id(id.job_id);
    part.set_stage(id.stage);
    part.set_step(id.step);
    part.set_offset(offset);
    part.set_total_bytes(total);
    part.set_keep(keep);
    const int64_t n = std::min(kCheckpointPartBytes, total - offset);
    part.set_data(file.substr(static_cast<std::size_t>(offset), static_cast<std::size_t>(n)));
    grpc::ClientContext context;
    Prepare(&context, timeout_s);
    v1::Empty reply;
    Status st = FromGrpc(stub->WriteCheckpointCopy(&context, part, &reply));
    if (!st.ok()) return Annotate(st, "sending the copy of checkpoint " + id.Describe() + " to " + address);
    offset += n;
  } while (offset < total);
  return absl::OkStatus();
}

StatusOr<v1::CheckpointHeader> PeerCheckpointHeader(const std::vector<std::string>& peers, const CheckpointFileId& id,
                                                    double timeout_s, std::string* holder,
                                                    const std::function<bool(const v1::CheckpointHeader&)>& fits) {
  std::string unreachable;
  for (const std::string& peer : peers) {
    v1::CheckpointFileRequest req = RequestFor(id);
    req.set_header_only(true);
    grpc::ClientContext context;
    // A lost peer must not hold the load up: no wait for its connection.
    context.set_deadline(DeadlineAfter(timeout_s));
    v1::CheckpointFilePart part;
    Status st = FromGrpc(StubFor(peer)->ReadCheckpointFile(&context, req, &part));
    if (st.ok() && fits(part.header())) {
      *holder = peer;
      return part.header();
    }
    if (st.ok()) continue;
    if (!absl::IsNotFound(st)) unreachable += (unreachable.empty() ? "" : "; ") + peer + ": " + std::string(st.message());
  }
  std::string where;
  for (const std::string& peer : peers) where += (where.empty() ? "" : ", ") + peer;
  const std::string what = "no server of the job (" + where + ") holds checkpoint " + id.Describe();
  if (!unreachable.empty()) return absl::UnavailableError(what + " (not asked: " + unreachable + ")");
  return absl::NotFoundError(what);
}

StatusOr<std::string> PeerCheckpointFile(const std::string& holder, const CheckpointFileId& id, double timeout_s) {
  auto stub = StubFor(holder);
  std::string file;
  int64_t total = -1;
  while (total < 0 || static_cast<int64_t>(file.size()) < total) {
    v1::CheckpointFileRequest req = RequestFor(id);
    req.set_offset(static_cast<int64_t>(file.size()));
    grpc::ClientContext context;
    Prepare(&context, timeout_s);
    v1::CheckpointFilePart part;
    Status st = FromGrpc(stub->ReadCheckpointFile(&context, req, &part));
    if (!st.ok()) return Annotate(st, "reading checkpoint " + id.Describe() + " from " + holder);
    if (total >= 0 && part.total_bytes() != total)
      return absl::DataLossError("checkpoint " + id.Describe() + " on " + holder + " changed while it was read");
    total = part.total_bytes();
    if (part.data().empty() && static_cast<int64_t>(file.size()) < total)
      return absl::DataLossError("checkpoint " + id.Describe() + " on " + holder + " ended early");
    file += part.data();
  }
  return std::move(file);
}

}  // namespace conveyor
