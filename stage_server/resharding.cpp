// A stage's checkpoints across servers (see stage_impl.h): the copy sent to
// the server that keeps it, the files served to peers, and loading a
// checkpoint written under another cut of the model (resharding), by the
// names the model gives its parameters.
#include "stage_server/stage.h"
#include "stage_server/stage_impl.h"

#include <functional>

#include "plan/placement.h"
#include "stage_server/checkpoint_peers.h"

namespace conveyor {
namespace {

// How long one part of a file may take to travel between two servers.
constexpr double kPartTimeoutS = 60;

// A checkpoint's tensors by the names the model gives them, gathered from
// the files of the stages that held some layer of this one.
struct NamedState {
  std::map<std::string, at::Tensor> params, buffers;
  std::map<std::string, std::map<std::string, at::Tensor>> optimizer;  // by parameter, then field
  at::Tensor rng;
};

bool Overlaps(const v1::CheckpointHeader& h, const v1::StageAssignment& a) {
  for (const auto& theirs : h.chunks())
    for (const auto& mine : a.chunks())
      if (theirs.layer_begin() < mine.layer_end() && mine.layer_begin() < theirs.layer_end()) return true;
  return false;
}

// The tensors of one stage's checkpoint, named from its header, into `into`.
Status ReadNamed(const std::string& payload, const v1::CheckpointHeader& h, const std::string& where,
                 const at::Device& device, NamedState* into) {
  try {
    torch::serialize::InputArchive archive;
    std::istringstream in(payload);
    archive.load_from(in, device);
    torch::serialize::InputArchive whole;
    at::Tensor probe;
    if (archive.try_read("optimizer", whole) || archive.try_read("optimizer_slice0", probe, true)) {
      return absl::FailedPreconditionError("checkpoint " + where + " keeps its optimizer state " +
                                           (probe.defined() ? std::string("sliced over replicas (zero 1)") : "whole") +
                                           ", as written before it was kept by parameter: it loads only under the "
                                           "cut it was written with");
    }
    for (int i = 0; i < h.parameter_names_size(); ++i) {
      at::Tensor t;
      archive.read("p" + std::to_string(i), t);
      into->params[h.parameter_names(i)] = t;
      auto& state = into->optimizer[h.parameter_names(i)];
      for (const char* field : kOptimizerFields) {
        at::Tensor f;
        if (archive.try_read("o" + std::to_string(i) + "_" + field, f, /*is_buffer=*/true)) state[field] = f;
      }
    }
    for (int j = 0; j < h.buffer_names_size(); ++j) {
      at::Tensor t;
      archive.read("b" + std::to_string(j), t, /*is_buffer=*/true);
      into->buffers[h.buffer_names(j)] = t;
    }
    if (!into->rng.defined()) archive.read("rng_cpu", into->rng, /*is_buffer=*/true);
  } catch (const c10::Error& e) {
    return absl::DataLossError("checkpoint " + where + " cannot be read: " + e.what_without_backtrace());
  }
  return absl::OkStatus();
}

// Copies `named`'s tensor `name` into `into`.
Status CopyNamed(const std::map<std::string, at::Tensor>& named, const std::string& name, const at::Tensor& into,
                 int64_t step) {
  auto it = named.find(name);
  if (it == named.end())
    return absl::FailedPreconditionError("the checkpoint of step " + std::to_string(step) + " has no " + name +
                                         " in the files of the stages that held its layers");
  if (it->second.sizes() != into.sizes() || it->second.scalar_type() != into.scalar_type())
    return absl::FailedPreconditionError("the checkpoint of step " + std::to_string(step) + " holds " + name +
                                         " with another shape or dtype than this stage's");
  at::Tensor dst = into;
  dst.copy_(it->second);
  return absl::OkStatus();
}

using Fits = std::function<bool(const v1::CheckpointHeader&)>;

// The file of `id` whose header `fits`: this server's own or the copy it
// keeps, else the file or copy of the first of `peers` that has one. A peer's
// file that `wanted` (where given) says is not needed is not fetched: empty.
// `header` receives its header, `where` where it was.
StatusOr<std::string> LocateCheckpoint(const CheckpointFiles& files, const CheckpointFileId& id,
                                       const std::vector<std::string>& peers, const Fits& fits, const Fits& wanted,
                                       v1::CheckpointHeader* header, std::string* where) {
  auto file = files.ReadFile(id.job_id, id.stage, id.step, header, where);
  if (file.ok() && !fits(*header)) file = absl::NotFoundError(*where + " was written under another cut");
  if (!absl::IsNotFound(file.status()) || peers.empty()) return file;
  std::string holder;
  CONVEYOR_ASSIGN_OR_RETURN(*header, PeerCheckpointHeader(peers, id, kPartTimeoutS, &holder, fits));
  if (wanted && !wanted(*header)) return std::string();
  *where = holder + " (checkpoint " + id.Describe() + ")";
  return PeerCheckpointFile(holder, id, kPartTimeoutS);
}

}  // namespace

StatusOr<v1::CheckpointFilePart> Stage::Impl::ReadCheckpointFile(const v1::CheckpointFileRequest& req) {
  return checkpoints_.ReadPart(req);
}

StatusOr<v1::Empty> Stage::Impl::WriteCheckpointCopy(const v1::CheckpointFilePart& part) {
  std::lock_guard<std::mutex> lock(copies_mu_);
  CONVEYOR_RETURN_IF_ERROR(checkpoints_.WriteCopyPart(part));
  return v1::Empty();
}

Status Stage::Impl::SendCopy(const v1::CheckpointRecord& record) {
  CONVEYOR_ASSIGN_OR_RETURN(std::string file, ReadWholeFile(record.path()));
  CheckpointFileId id{job_->assignment.job_id(), job_->assignment.stage_index(), record.step()};
  return Annotate(SendCheckpointCopy(job_->assignment.checkpoint_copy_to(), id, file,
                                     job_->spec().keep_checkpoints(), kPartTimeoutS),
                  Who());
}

StatusOr<std::string> Stage::Impl::FindCheckpoint(const v1::LoadCheckpointRequest& req, v1::CheckpointHeader* header,
                                                  v1::CheckpointRecord* record) {
  const int stage = job_->assignment.stage_index();
  auto own = checkpoints_.Load(req.job_id(), stage, req.step(), header, record);
  if (own.ok() || !(absl::IsNotFound(own.status()) || checkpoints_.dir().empty())) return own;
  // The copy this server keeps, else a peer's file or copy.
  const CheckpointFileId id{req.job_id(), stage, req.step()};
  const int stages = req.stages() > 0 ? req.stages() : job_->assignment.num_stages();
  auto fits = [stages](const v1::CheckpointHeader& h) { return h.spec().partition().stages() == stages; };
  std::string where;
  CONVEYOR_ASSIGN_OR_RETURN(std::string file,
                            LocateCheckpoint(checkpoints_, id, {req.peers().begin(), req.peers().end()}, fits, nullptr,
                                             header, &where));
  CONVEYOR_ASSIGN_OR_RETURN(std::string payload, ParseCheckpoint(file, where, header));
  record->set_step(id.step);
  record->set_path(where);
  record->set_bytes(static_cast<int64_t>(file.size()));
  return payload;
}

Status Stage::Impl::LoadResharded(const v1::LoadCheckpointRequest& req, v1::LoadCheckpointReply* reply) {
  const v1::StageAssignment& a = job_->assignment;
  const int stages = req.stages() > 0 ? req.stages() : a.num_stages();
  const std::vector<std::string> peers(req.peers().begin(), req.peers().end());
  const std::string digest = TrainingDigest(a.spec());
  NamedState state;
  std::string sources;
  // A file of the step under another cut (an attempt that a failure cut
  // short, before the job went on under this one) is not this checkpoint's.
  auto fits = [stages](const v1::CheckpointHeader& h) { return h.spec().partition().stages() == stages; };
  for (int s = 0; s < stages; ++s) {
    CheckpointFileId id{req.job_id(), s, req.step()};
    v1::CheckpointHeader header;
    std::string where;
    auto file = LocateCheckpoint(checkpoints_, id, peers, fits, [&a](const v1::CheckpointHeader& h) { return Overlaps(h, a); },
                                 &header, &where);
    if (!file.ok()) return Annotate(file.status(), Who());
    if (file->empty()) continue;  // a peer's stage that held none of these layers
    CONVEYOR_ASSIGN_OR_RETURN(std::string payload, ParseCheckpoint(*file, where, &header));
    if (header.job_id() != id.job_id || header.stage_index() != s || header.step() != id.step)
      return absl::FailedPreconditionError(Who() + ": " + where + " is not checkpoint " + id.Describe());
    if (!Overlaps(header, a)) continue;
    if (!header.has_spec() || header.parameter_names_size() == 0)
      return absl::FailedPreconditionError(Who() + ": checkpoint " + where +
                                           " was written before checkpoints carried their names and spec; it loads "
                                           "only under the cut it was written with");
    if (TrainingDigest(header.spec()) != digest)
      return absl::FailedPreconditionError(Who() + ": checkpoint " + where +
                                           " was trained by another job spec (more than its layout differs)");
    CONVEYOR_RETURN_IF_ERROR(Annotate(ReadNamed(payload, header, where, device_, &state), Who()));
    sources += (sources.empty() ? "" : ", ") + where;
  }
  try {
    at::NoGradGuard no_grad;
    for (const Chunk& c : job_->chunks) {
      for (const auto& [name, p] : c.layers->NamedParameters())
        CONVEYOR_RETURN_IF_ERROR(Annotate(CopyNamed(state.params, name, p, req.step()), Who()));
      for (const auto& [name, b] : c.layers->NamedBuffers())
        CONVEYOR_RETURN_IF_ERROR(Annotate(CopyNamed(state.buffers, name, b, req.step()), Who()));
    }
    CONVEYOR_RETURN_IF_ERROR(Annotate(SetOptimizerState(state.optimizer), Who()));
    if (state.rng.defined()) {
      at::Generator gen = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(state.rng.to(at::kCPU));
    }
  } catch (const c10::Error& e) {
    return absl::DataLossError(Who() + ": loading the checkpoint of step " + std::to_string(req.step()) + ": " +
                               e.what_without_backtrace());
  }
  reply->mutable_checkpoint()->set_step(req.step());
  reply->mutable_checkpoint()->set_path(sources);
  LOG_INFO("job ", req.job_id(), " ", Who(), ": resharded the checkpoint of step ", req.step(), " from ", sources);
  return absl::OkStatus();
}

}  // namespace conveyor
