// A stage's state: checkpoints, digests and parameters (see stage_impl.h).
#include "stage_server/stage.h"
#include "stage_server/stage_impl.h"
#include "stage_server/stage_metrics.h"

#include "common/wire.h"
#include "model/torchscript_export.h"
#include "plan/placement.h"

namespace conveyor {

v1::CheckpointHeader Stage::Impl::CheckpointHeaderFor(int64_t step) const {
  v1::CheckpointHeader h;
  h.set_job_id(job_->assignment.job_id());
  h.set_stage_index(job_->assignment.stage_index());
  h.set_step(step);
  for (const auto& c : job_->assignment.chunks()) {
    v1::ChunkAssignment* ca = h.add_chunks();
    ca->set_index(c.index());
    ca->set_layer_begin(c.layer_begin());
    ca->set_layer_end(c.layer_end());
  }
  Sha256 sum;
  sum.Update(job_->spec().SerializeAsString());
  h.set_spec_digest(HexString(sum.Final()));
  *h.mutable_spec() = job_->spec();
  for (const Chunk& c : job_->chunks) {
    for (const auto& [name, t] : c.layers->NamedParameters()) h.add_parameter_names(name);
    for (const auto& [name, t] : c.layers->NamedBuffers()) h.add_buffer_names(name);
  }
  return h;
}

std::string Stage::Impl::SerializeState() {
  torch::serialize::OutputArchive archive;
  int64_t i = 0, j = 0;
  for (const Chunk& c : job_->chunks) {
    for (const auto& p : c.layers->Parameters()) archive.write("p" + std::to_string(i++), p.detach());
    for (const auto& b : c.layers->Buffers()) archive.write("b" + std::to_string(j++), b, /*is_buffer=*/true);
  }
  if (job_->optimizer) {
    // By parameter, o<i>_<field> beside p<i>: a checkpoint that loads under
    // any cut of the model and any replica count (LoadResharded), not the
    // optimizer's own archive, whose state is keyed by position in its
    // groups. Under zero 1 the state gathered whole from the replicas' parts
    // (GatherOptimizerState).
    int64_t k = 0;
    for (const Chunk& c : job_->chunks) {
      for (const auto& [name, p] : c.layers->NamedParameters()) {
        const std::string key = "o" + std::to_string(k++) + "_";
        if (!job_->sliced) {
          for (const auto& [field, t] : ParameterState(*job_->optimizer, p))
            archive.write(key + field, t, /*is_buffer=*/true);
          continue;
        }
        auto whole = job_->whole_state.find(name);
        if (whole == job_->whole_state.end()) continue;
        for (const auto& [field, t] : whole->second) archive.write(key + field, t, /*is_buffer=*/true);
      }
    }
  }
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    archive.write("rng_cpu", gen.get_state(), /*is_buffer=*/true);
  }
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

Status Stage::Impl::RestoreState(const std::string& payload, const std::string& path) {
  try {
    torch::serialize::InputArchive archive;
    std::istringstream in(payload);
    archive.load_from(in, device_);
    at::NoGradGuard no_grad;
    auto load = [&](const std::string& key, const at::Tensor& into, bool buffer) -> Status {
      at::Tensor t;
      archive.read(key, t, buffer);
      if (!t.defined() || t.sizes() != into.sizes() || t.scalar_type() != into.scalar_type())
        return absl::FailedPreconditionError("checkpoint " + path + ": " + key + " does not fit this stage's layers");
      at::Tensor dst = into;
      dst.copy_(t);
      return absl::OkStatus();
    };
    int64_t i = 0, j = 0;
    for (const Chunk& c : job_->chunks) {
      for (const auto& p : c.layers->Parameters()) CONVEYOR_RETURN_IF_ERROR(load("p" + std::to_string(i++), p, false));
      for (const auto& b : c.layers->Buffers()) CONVEYOR_RETURN_IF_ERROR(load("b" + std::to_string(j++), b, true));
    }
    // zero 1, written before its state was gathered by parameter: one share
    // a replica; this replica's, where as many replicas wrote it
    // (RestoreOptimizer refuses the others).
    at::Tensor bytes, last, beyond;
    const int replicas = job_->assignment.num_replicas();
    auto slice = [](int k) { return "optimizer_slice" + std::to_string(k); };
    if (job_->sliced && job_->optimizer && archive.try_read(slice(replicas - 1), last, /*is_buffer=*/true) &&
        !archive.try_read(slice(replicas), beyond, /*is_buffer=*/true)) {
      archive.read(slice(job_->assignment.replica()), bytes, /*is_buffer=*/true);
      bytes = bytes.to(at::kCPU).contiguous();
      std::istringstream shard(std::string(static_cast<const char*>(bytes.data_ptr()), static_cast<std::size_t>(bytes.numel())));
      torch::serialize::InputArchive opt;
      opt.load_from(shard, device_);
      job_->optimizer->load(opt);
    } else if (job_->optimizer) {
      CONVEYOR_RETURN_IF_ERROR(RestoreOptimizer(archive, path));
    }
    at::Tensor rng;
    archive.read("rng_cpu", rng, true);
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(rng.to(at::kCPU));
  } catch (const c10::Error& e) {
    return absl::DataLossError("checkpoint " + path + " cannot be read: " + e.what_without_backtrace());
  }
  return absl::OkStatus();
}

Status Stage::Impl::RestoreOptimizer(torch::serialize::InputArchive& archive, const std::string& path) {
  torch::serialize::InputArchive whole;
  if (archive.try_read("optimizer", whole)) {  // written before the state was kept by parameter
    job_->optimizer->load(whole);
    return absl::OkStatus();
  }
  at::Tensor slice;
  if (archive.try_read("optimizer_slice0", slice, /*is_buffer=*/true)) {
    return absl::FailedPreconditionError("checkpoint " + path +
                                         " keeps its optimizer state sliced over another number of replicas (zero 1, "
                                         "written before the state was kept by parameter): resume it with the "
                                         "replicas it was written with");
  }
  std::map<std::string, std::map<std::string, at::Tensor>> by_name;
  int64_t k = 0;
  for (const Chunk& c : job_->chunks) {
    for (const auto& [name, p] : c.layers->NamedParameters()) {
      auto& state = by_name[name];
      for (const char* field : kOptimizerFields) {
        at::Tensor t;
        if (archive.try_read("o" + std::to_string(k) + "_" + field, t, /*is_buffer=*/true)) state[field] = t;
      }
      ++k;
    }
  }
  return Annotate(SetOptimizerState(by_name), "checkpoint " + path);
}

Status Stage::Impl::SetOptimizerState(std::map<std::string, std::map<std::string, at::Tensor>>& by_name) {
  if (!job_->optimizer) return absl::OkStatus();
  if (!job_->sliced) {
    for (const Chunk& c : job_->chunks) {
      for (const auto& [name, p] : c.layers->NamedParameters()) {
        if (!p.requires_grad()) continue;
        CONVEYOR_RETURN_IF_ERROR(Annotate(SetParameterState(*job_->optimizer, p, by_name[name]), "parameter " + name));
      }
    }
    return absl::OkStatus();
  }
  // zero 1: each field of every parameter, whole, cut into this replica's parts.
  const std::size_t n = job_->param_names.size();
  std::map<std::string, std::vector<at::Tensor>> whole;
  for (std::size_t i = 0; i < n; ++i) {
    for (const auto& [field, t] : by_name[job_->param_names[i]]) {
      if (field == "step") continue;
      whole[field].resize(n);
      whole[field][i] = t;
    }
  }
  std::vector<std::map<std::string, at::Tensor>> parts(job_->updated.size());
  for (const auto& [field, tensors] : whole) {
    auto cut = job_->reducer->PartsOf(tensors);
    if (!cut.ok()) return Annotate(cut.status(), field);
    for (std::size_t j = 0; j < parts.size(); ++j) parts[j][field] = (*cut)[j];
  }
  for (std::size_t j = 0; j < parts.size(); ++j) {
    const std::string& name = job_->param_names[job_->updated_params[j]];
    const auto& of = by_name[name];
    if (of.empty()) parts[j].clear();  // no state: none for its parts either
    if (auto step = of.find("step"); step != of.end()) parts[j]["step"] = step->second;
    CONVEYOR_RETURN_IF_ERROR(
        Annotate(SetParameterState(*job_->optimizer, job_->updated[j], parts[j]), "parameter " + name + "'s part"));
  }
  return absl::OkStatus();
}

StatusOr<v1::CheckpointRecord> Stage::Impl::SaveCheckpoint(int64_t step, bool copy) {
  std::string payload;
  try {
    payload = SerializeState();
  } catch (const c10::Error& e) {
    return absl::InternalError(std::string("serialising the state: ") + e.what_without_backtrace());
  }
  auto start = SteadyClock::now();
  CONVEYOR_ASSIGN_OR_RETURN(v1::CheckpointRecord record,
                            checkpoints_.Save(CheckpointHeaderFor(step), payload, job_->spec().keep_checkpoints()));
  const double seconds = std::chrono::duration<double>(SteadyClock::now() - start).count();
  metrics::Observe(metrics::Id::kStageCheckpointSeconds,
                   StageLabels(job_->assignment.job_id(), job_->assignment.stage_index(), job_->assignment.replica()),
                   seconds);
  LOG_DEBUG("job ", job_->assignment.job_id(), " ", Who(), ": checkpoint of step ", step, " (", record.bytes(),
            " bytes) in ", seconds, " s");
  if (copy && !job_->assignment.checkpoint_copy_to().empty()) CONVEYOR_RETURN_IF_ERROR(SendCopy(record));
  return record;
}

void Stage::Impl::KeepStepStart() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    job_->step_start_rng = gen.get_state();
  }
  job_->step_start_buffers.clear();
  at::NoGradGuard no_grad;
  for (const Chunk& c : job_->chunks)
    for (const at::Tensor& b : c.layers->Buffers()) job_->step_start_buffers.push_back(b.defined() ? b.clone() : b);
}

void Stage::Impl::TakeBackStep() {
  if (!job_->step_start_rng.defined()) return;
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(job_->step_start_rng);
  }
  at::NoGradGuard no_grad;
  std::size_t i = 0;
  for (const Chunk& c : job_->chunks) {
    for (const at::Tensor& b : c.layers->Buffers()) {
      if (i < job_->step_start_buffers.size() && b.defined()) b.copy_(job_->step_start_buffers[i]);
      ++i;
    }
  }
}

StatusOr<v1::CheckpointRecord> Stage::Impl::SaveState(const v1::JobRef& ref) {
  CONVEYOR_RETURN_IF_ERROR(CheckJob(ref.job_id()));
  const int64_t step = job_->state_step;
  if (!job_->spec().commit_steps())
    return absl::FailedPreconditionError(Who() + ": the job does not commit its steps (commit_steps)");
  if (job_->sliced)
    return absl::FailedPreconditionError(Who() + ": under zero 1 this replica holds a slice of the optimizer state");
  if (step < 1)
    return absl::FailedPreconditionError(Who() + (step < 0 ? ": an optimizer step was being applied when it stopped"
                                                           : ": no optimizer step was applied yet"));
  // The step begun after it was not applied: its passes moved the generator
  // and the buffers (BatchNorm's statistics), which go back to where it began.
  if (job_->begun_step >= step) TakeBackStep();
  job_->pending_step = -1;
  CONVEYOR_ASSIGN_OR_RETURN(v1::CheckpointRecord record, SaveCheckpoint(step, /*copy=*/false));
  LOG_INFO("job ", ref.job_id(), " ", Who(), ": wrote its state after step ", step, " as a checkpoint");
  return record;
}

StatusOr<v1::LoadCheckpointReply> Stage::Impl::LoadCheckpoint(const v1::LoadCheckpointRequest& req) {
  CONVEYOR_RETURN_IF_ERROR(CheckJob(req.job_id()));
  if (req.step() < 1) return absl::InvalidArgumentError(Who() + ": checkpoints start at step 1");
  v1::LoadCheckpointReply reply;
  const bool same_cut = req.stages() == 0 || req.stages() == job_->assignment.num_stages();
  if (same_cut || job_->replica_group) {
    auto own = LoadOwnCheckpoint(req);
    // Not here, or written under another cut: read from the stages that
    // held these layers then, wherever their files or copies are.
    const bool elsewhere = absl::IsNotFound(own.status()) || absl::IsFailedPrecondition(own.status());
    if (own.ok() || job_->replica_group || req.peers().empty() || !elsewhere) return own;
    LOG_INFO("job ", req.job_id(), " ", Who(), ": ", own.status().message(), "; reading it from the job's servers");
  }
  CONVEYOR_RETURN_IF_ERROR(LoadResharded(req, &reply));
  AfterLoad(req.step());
  return reply;
}

void Stage::Impl::AfterLoad(int64_t step) {
  job_->state_step = step;
  // Training goes on at step `step`: its tensors may arrive before its RunStep.
  inbox_.BeginStep(v1::PHASE_TRAIN, step * AccumulateSteps(job_->spec()) - 1);
  {
    std::lock_guard<std::mutex> lock(info_mu_);
    next_train_step_ = step;
  }
  turn_cv_.notify_all();
  LOG_INFO("job ", job_->assignment.job_id(), " ", Who(), ": loaded the checkpoint of step ", step);
}

StatusOr<v1::LoadCheckpointReply> Stage::Impl::LoadOwnCheckpoint(const v1::LoadCheckpointRequest& req) {
  v1::LoadCheckpointReply reply;
  v1::CheckpointHeader header;
  const int stage = job_->assignment.stage_index();
  std::string payload;
  if (job_->replica_group) {
    // Replicas: replica 0 reads the file and sends header and payload to the
    // other copies of this stage; it sends its error instead where it has none.
    CONVEYOR_ASSIGN_OR_RETURN(payload, ReplicaCheckpoint(req, &header, reply.mutable_checkpoint()));
  } else {
    CONVEYOR_ASSIGN_OR_RETURN(payload,
                              checkpoints_.Load(req.job_id(), stage, req.step(), &header, reply.mutable_checkpoint()));
  }
  const v1::CheckpointHeader expected = CheckpointHeaderFor(req.step());
  // Another layout of the same training (replicas dropped, other transports,
  // zero 1 or not) holds the same state where the cut is the same.
  const bool same_training = TrainingDigest(header.spec()) == TrainingDigest(job_->spec());
  if (header.spec_digest() != expected.spec_digest() && !same_training)
    return absl::FailedPreconditionError(Who() + ": checkpoint " + reply.checkpoint().path() +
                                         " was written for another job spec");
  for (int i = 0; i < expected.chunks_size(); ++i) {
    if (header.chunks_size() != expected.chunks_size() ||
        header.chunks(i).SerializeAsString() != expected.chunks(i).SerializeAsString())
      return absl::FailedPreconditionError(Who() + ": checkpoint " + reply.checkpoint().path() +
                                           " holds another partition of the model");
  }
  CONVEYOR_RETURN_IF_ERROR(Annotate(RestoreState(payload, reply.checkpoint().path()), Who()));
  AfterLoad(req.step());
  return reply;
}

StatusOr<std::string> Stage::Impl::ReplicaCheckpoint(const v1::LoadCheckpointRequest& req, v1::CheckpointHeader* header,
                                                     v1::CheckpointRecord* record) {
  // What travels: a ReplicaCheckpoint message (the status, the header, the
  // record), then the payload.
  v1::ReplicaCheckpoint sent;
  std::string payload;
  Status loaded;  // replica 0's reading of its file
  if (job_->assignment.replica() == 0) {
    auto file = FindCheckpoint(req, header, record);
    loaded = file.status();
    if (file.ok()) {
      payload = std::move(*file);
      *sent.mutable_header() = *header;
      *sent.mutable_record() = *record;
    } else {
      sent.set_code(static_cast<int>(loaded.code()));
      sent.set_error(std::string(loaded.message()));
    }
  }
  std::string message = sent.SerializeAsString();
  CONVEYOR_RETURN_IF_ERROR(Annotate(job_->replica_group->BroadcastBytes(&message), Who() + " loading its checkpoint"));
  if (job_->assignment.replica() == 0) {
    CONVEYOR_RETURN_IF_ERROR(loaded);
    CONVEYOR_RETURN_IF_ERROR(Annotate(job_->replica_group->BroadcastBytes(&payload), Who() + " sending its checkpoint"));
    return payload;
  }
  if (!sent.ParseFromString(message))
    return absl::DataLossError(Who() + ": replica 0's checkpoint of step " + std::to_string(req.step()) + " came garbled");
  if (sent.code() != 0) {
    return Status(static_cast<absl::StatusCode>(sent.code()),
                  Who() + ": replica 0 has no usable checkpoint of step " + std::to_string(req.step()) + ": " + sent.error());
  }
  CONVEYOR_RETURN_IF_ERROR(Annotate(job_->replica_group->BroadcastBytes(&payload), Who() + " receiving its checkpoint"));
  *header = sent.header();
  *record = sent.record();
  record->set_path(record->path() + " (replica 0's, received)");
  return payload;
}

StatusOr<v1::DigestReply> Stage::Impl::GetDigest(const v1::JobRef& ref) {
  CONVEYOR_RETURN_IF_ERROR(CheckJob(ref.job_id()));
  v1::DigestReply reply;
  for (const Chunk& c : job_->chunks) {
    for (int i = 0; i < c.layers->num_layers(); ++i) {
      reply.add_layer_digests(c.layers->LayerDigest(i));
      reply.add_layers(c.layers->layer_index(i));
    }
  }
  return reply;
}

StatusOr<v1::ParametersReply> Stage::Impl::GetParameters(const v1::JobRef& ref) {
  CONVEYOR_RETURN_IF_ERROR(CheckJob(ref.job_id()));
  NamedTensors params, buffers;
  for (const Chunk& c : job_->chunks) {
    for (auto& named : c.layers->NamedParameters()) params.push_back(std::move(named));
    for (auto& named : c.layers->NamedBuffers()) buffers.push_back(std::move(named));
  }
  const int64_t total = static_cast<int64_t>(params.size() + buffers.size());
  if (ref.first_tensor() < 0 || ref.first_tensor() > total || ref.max_bytes() < 0)
    return absl::InvalidArgumentError(Who() + ": GetParameters from tensor " + std::to_string(ref.first_tensor()) +
                                      " with max_bytes " + std::to_string(ref.max_bytes()) + ": this stage holds " +
                                      std::to_string(total) + " tensors");
  // Parameters, then buffers; as many as fit max_bytes (at least one).
  v1::ParametersReply reply;
  int64_t bytes = 0;
  for (int64_t i = ref.first_tensor(); i < total; ++i) {
    const bool param = i < static_cast<int64_t>(params.size());
    const auto& [name, t] = param ? params[static_cast<std::size_t>(i)]
                                  : buffers[static_cast<std::size_t>(i - static_cast<int64_t>(params.size()))];
    const int64_t size = t.numel() * static_cast<int64_t>(t.element_size());
    if (ref.max_bytes() > 0 && i > ref.first_tensor() && bytes + size > ref.max_bytes()) {
      reply.set_next_tensor(i);
      break;
    }
    bytes += size;
    v1::NamedTensor* nt = param ? reply.add_parameters() : reply.add_buffers();
    nt->set_name(name);
    CONVEYOR_RETURN_IF_ERROR(EncodeTensor(t, nt->mutable_tensor()));
  }
  return reply;
}

StatusOr<v1::TorchScriptReply> Stage::Impl::ExportTorchScript(const v1::TorchScriptRequest& req) {
  CONVEYOR_RETURN_IF_ERROR(CheckJob(req.job_id()));
  const v1::ModelSpec& model = job_->spec().model();
  if (model.kind() != v1::MODEL_TORCHSCRIPT)
    return absl::InvalidArgumentError("format torchscript needs a model from a TorchScript archive (model: "
                                      "{torchscript: PATH}); " +
                                      (model.kind() == v1::MODEL_EXPORTED ? std::string("an exported program")
                                                                           : "the zoo's " + ModelName(model.kind())) +
                                      " exports as a state_dict only");
  NamedTensors weights;
  for (const v1::ParametersReply& part : req.parts()) {
    for (const auto* list : {&part.parameters(), &part.buffers()}) {
      for (const v1::NamedTensor& nt : *list) {
        v1::Tensor t = nt.tensor();
        CONVEYOR_RETURN_IF_ERROR(CheckWireTensor(t, t.dtype(), {t.shape().begin(), t.shape().end()}, nt.name()));
        weights.emplace_back(nt.name(), DecodeTensor(&t));
      }
    }
  }
  v1::TorchScriptReply reply;
  CONVEYOR_ASSIGN_OR_RETURN(*reply.mutable_archive(), TorchScriptWithWeights(model.torchscript(), weights));
  return reply;
}

}  // namespace conveyor
