// After a step's passes: the gradients reduced over replicas, the gradient
// norm's shares and the optimizer step, ZeRO-1's shards, and the checkpoint a
// step ends with (see stage_impl.h).
#include "stage_server/stage.h"
#include "stage_server/stage_impl.h"

#include <cmath>
#include <limits>

namespace conveyor {

// The step's learning rate and this stage's share of the squared gradient
// norm, then the optimizer step, unless the coordinator asked to combine the
// shares first (ApplyStep) or the loss or a gradient is not finite: then the
// reply says so and the coordinator fails the job naming the step and stage.
Status Stage::Impl::PrepareUpdate(StepState& st) {
  const v1::JobSpec& spec = job_->spec();
  const int64_t step = st.req->step();
  const double lr = LearningRate(spec, step, std::max(st.req->total_steps(), step + 1));
  SetLearningRate(*job_->optimizer, lr);
  st.reply->set_lr(lr);
  const std::vector<at::Tensor> params = UpdatedParams();
  // Loss scaling: the gradients back to the loss's own scale (GradScaler's
  // unscale_), then the test's injected overflow, if any, at this step.
  const double loss_scale = st.req->loss_scale();
  if (loss_scale > 0 && loss_scale != 1) ScaleGrads(params, 1 / loss_scale);
  for (const v1::InfGradient& g : spec.inject_inf_gradients()) {
    if (g.stage() != job_->assignment.stage_index() || g.step() != step) continue;
    for (const at::Tensor& p : params) {
      if (!p.grad().defined() || p.grad().numel() == 0) continue;
      p.grad().view(-1)[0].fill_(std::numeric_limits<double>::infinity());
      break;
    }
  }
  if (ReadsAfterUpdate(*st.req)) {
    // On a GPU nothing needs the norm on the host before the update: the
    // device clips with it, and the host reads it after the step (as the
    // reference does). Alone, the stage clips its own gradients: they are all
    // of them.
    st.sq = GradSquaredNormTensor(params);
    CONVEYOR_RETURN_IF_ERROR(SumOverSlices(st.sq));
    st.reply->set_updated_before_read(true);
    job_->pending_step = -1;
    if (spec.clip_grad_norm() > 0) ClipGradsOnDevice(params, spec.clip_grad_norm(), st.sq);
    job_->optimizer->step();
    return ShareShardedParameters();
  }
  at::Tensor sq_sum = GradSquaredNormTensor(params);
  CONVEYOR_RETURN_IF_ERROR(SumOverSlices(sq_sum));
  const double sq = sq_sum.defined() ? sq_sum.item<double>() : 0.0;
  st.reply->set_grad_sq_norm(sq);
  if (st.loss_total.defined()) st.loss_sum = st.loss_total.item<double>();
  job_->pending_step = -1;
  // Under loss scaling a gradient that is not finite skips the step on every
  // stage (the coordinator decides, in ApplyStep); otherwise it fails the job.
  const bool scaling = loss_scale > 0;
  if ((!scaling && !std::isfinite(sq)) || !std::isfinite(st.loss_sum)) {
    st.skipped = true;  // no update, no checkpoint: the coordinator fails the job
    return absl::OkStatus();
  }
  if (st.req->defer_update()) {
    job_->pending_step = step;
    return absl::OkStatus();
  }
  if (!std::isfinite(sq)) return absl::OkStatus();  // loss scaling, one stage deciding alone: skipped
  // Alone (one stage), the stage clips its own gradients: they are all of them.
  if (spec.clip_grad_norm() > 0) ScaleGrads(params, ClipFactor(spec.clip_grad_norm(), std::sqrt(sq)));
  job_->optimizer->step();
  return ShareShardedParameters();
}

std::vector<at::Tensor> Stage::Impl::UpdatedParams() const {
  if (job_->sliced) return job_->updated;
  std::vector<at::Tensor> params;
  for (const Chunk& c : job_->chunks) params.insert(params.end(), c.params.begin(), c.params.end());
  return params;
}

Status Stage::Impl::SumOverSlices(at::Tensor& sq) {
  if (!job_->sliced) return absl::OkStatus();
  // Each replica's slices hold part of the gradients: the squared norm is
  // the sum of theirs (on the device under NCCL: no host wait here).
  if (!sq.defined()) sq = at::zeros({}, at::TensorOptions(device_).dtype(at::kDouble));
  CONVEYOR_ASSIGN_OR_RETURN(std::unique_ptr<ReplicaGroup::Work> work,
                            job_->replica_group->StartAllReduce(sq.reshape({1})));
  return Annotate(work->Wait(), Who() + " summing the gradient norm's slices");
}

Status Stage::Impl::ShareShardedParameters() {
  if (!job_->sliced) return absl::OkStatus();
  at::NoGradGuard no_grad;
  return Annotate(job_->reducer->GatherParameters(), Who() + " gathering the parameters the replicas updated");
}

Status Stage::Impl::GatherOptimizerState() {
  job_->whole_state.clear();
  const std::size_t n = job_->updated.size();
  // Each field of every part; every part takes every step, so one step.
  std::map<std::string, std::vector<at::Tensor>> fields;
  at::Tensor step;
  for (std::size_t j = 0; j < n; ++j) {
    for (const auto& [field, t] : ParameterState(*job_->optimizer, job_->updated[j])) {
      if (field == "step") {
        step = t;
        continue;
      }
      auto& parts = fields[field];
      parts.resize(n);
      parts[j] = t;
    }
  }
  const bool keep = job_->assignment.replica() == 0;
  for (const char* field : kOptimizerFields) {  // in one order on every replica
    auto it = fields.find(field);
    if (it == fields.end()) continue;
    auto whole = job_->reducer->GatherWhole(it->second);
    if (!whole.ok())
      return Annotate(whole.status(), Who() + " gathering the replicas' optimizer state (" + field + ")");
    for (std::size_t i = 0; keep && i < whole->size(); ++i)
      job_->whole_state[job_->param_names[i]][field] = (*whole)[i];
  }
  for (auto& [name, state] : job_->whole_state)
    if (step.defined()) state["step"] = step;
  return absl::OkStatus();
}

StatusOr<v1::ApplyStepReply> Stage::Impl::ApplyStep(const v1::ApplyStepRequest& req) {
  CONVEYOR_RETURN_IF_ERROR(CheckJob(req.job_id()));
  CONVEYOR_RETURN_IF_ERROR(CheckDeployment(req.deployment(), "the update of step " + std::to_string(req.step())));
  // A stage without trainable parameters has no optimizer and holds nothing.
  if (job_->optimizer && job_->pending_step != req.step())
    return absl::FailedPreconditionError(Who() + ": no deferred update of step " + std::to_string(req.step()) +
                                         " to apply (RunStep with defer_update first)");
  if (!req.skip() && (!(req.grad_scale() > 0) || req.grad_scale() > 1))
    return absl::InvalidArgumentError(Who() + ": grad_scale must be in (0, 1], got " + std::to_string(req.grad_scale()));
  job_->pending_step = -1;
  job_->state_step = -1;  // until the update is whole
  try {
    if (job_->optimizer && req.skip()) {
      // A gradient somewhere was not finite: no step here either (the next
      // step zeroes the gradients first).
    } else if (job_->optimizer) {
      if (req.grad_scale() != 1) ScaleGrads(UpdatedParams(), req.grad_scale());
      job_->optimizer->step();
      CONVEYOR_RETURN_IF_ERROR(ShareShardedParameters());
    }
  } catch (const std::exception& e) {
    return TorchFailure(e, absl::StatusCode::kInternal, Who() + " step " + std::to_string(req.step()) + ", optimizer step");
  }
  job_->state_step = req.step() + 1;
  v1::ApplyStepReply reply;
  if (req.checkpoint()) {
    CONVEYOR_ASSIGN_OR_RETURN(*reply.mutable_checkpoint(), CheckpointAfter(req.step()));
  }
  return reply;
}

StatusOr<v1::CheckpointRecord> Stage::Impl::CheckpointAfter(int64_t step) {
  // The replicas hold the same state: replica 0 writes it for all of them
  // (a restored copy gets it from there, LoadCheckpoint). Under zero 1 each
  // holds a share of the optimizer's: replica 0 gathers them first.
  if (job_->sliced) CONVEYOR_RETURN_IF_ERROR(GatherOptimizerState());
  if (job_->assignment.num_replicas() > 1 && job_->assignment.replica() > 0) return v1::CheckpointRecord();
  auto record = SaveCheckpoint(step + 1);
  // The gathered state is the whole optimizer's: not kept past its file.
  job_->whole_state.clear();
  if (!record.ok()) {
    LOG_WARN("job ", job_->assignment.job_id(), " ", Who(), ": checkpoint of step ", step + 1, " failed: ",
             record.status().message());
    return Annotate(record.status(), Who() + " writing the checkpoint of step " + std::to_string(step + 1));
  }
  return record;
}

Status Stage::Impl::AllReduceGradients(StepState& st) {
  // The buckets the backward pass did not start, then the wait for all.
  const int64_t wait_start = NowUs();
  Status st_reduce = job_->reducer->Finish();
  // Each bucket's all-reduce on the timeline, from its start (often during
  // the backward pass) to its end; micro_batch is the bucket.
  for (const GradientReducer::Span& s : job_->reducer->spans()) {
    if (s.end_us == 0) continue;  // a step that ends off the executor: not seen done (ReplicaGroup::DeferConfirm)
    v1::TraceEvent* e = st.reply->add_events();
    e->set_kind(v1::TraceEvent::ALL_REDUCE);
    e->set_chunk(0);
    e->set_micro_batch(s.bucket);
    e->set_start_us(s.start_us);
    e->set_end_us(std::max(s.end_us, s.start_us));
  }
  LOG_DEBUG(Who(), ": all-reduce of ", job_->reducer->num_buckets(), " buckets waited ", NowUs() - wait_start, " us");
  return st_reduce;
}

Status Stage::Impl::BroadcastBuffers() {
  std::vector<at::Tensor> buffers;
  for (const Chunk& c : job_->chunks)
    for (const at::Tensor& b : c.layers->Buffers())
      if (b.defined() && b.numel() > 0) buffers.push_back(b);
  if (buffers.empty()) return absl::OkStatus();
  at::NoGradGuard no_grad;
  if (!job_->flat_buffers.Holds(buffers)) job_->flat_buffers = FlatViews::Make(buffers);
  return job_->replica_group->Broadcast(job_->flat_buffers.flats());
}

}  // namespace conveyor
