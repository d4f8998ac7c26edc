// One step of a stage: the action loop and the passes it runs (see stage_impl.h).
#include "stage_server/stage.h"
#include "stage_server/stage_impl.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <limits>

namespace conveyor {

StatusOr<Tensors> Stage::Impl::Receive(StepState& st, v1::FrameKind kind, int local, int mb) {
  Span span(st, v1::TraceEvent::RECEIVE, local, mb);
  const Chunk& c = job_->chunks[local];
  const bool act = kind == v1::FRAME_ACTIVATION;
  Tensors out;
  for (int part : PartsOf(act ? c.inputs : c.outputs, /*all=*/act)) {
    CONVEYOR_ASSIGN_OR_RETURN(Frame frame, inbox_.Take(kind, c.index, mb, Now() + st.timeout, part));
    if (frame.header.tensor().shape(0) != st.sizes[mb]) {
      return absl::InvalidArgumentError(Who() + " micro-batch " + std::to_string(mb) + ": " +
                                        (act ? "activation" : "gradient") +
                                        (part != 0 ? " tensor " + std::to_string(part) : "") + " has " +
                                        std::to_string(frame.header.tensor().shape(0)) + " samples, expected " +
                                        std::to_string(st.sizes[mb]));
    }
    out.push_back(TakeTensor(frame, device_));
  }
  return out;
}

// Down the chain activations go to the next stage and gradients to the one
// before (interleaved's last stage feeding the first); under zbv the V's
// second leg runs the other way and its turn stays on the last stage.
Stage::Impl::Route Stage::Impl::RouteTo(v1::FrameKind kind, int to_chunk) const {
  const v1::ScheduleKind schedule = job_->spec().schedule();
  const int p = job_->assignment.num_stages(), me = job_->assignment.stage_index();
  Route via{job_->transport.get(), kind == v1::FRAME_ACTIVATION ? Peer::kDownstream : Peer::kUpstream};
  if (schedule != v1::SCHEDULE_ZBV || p == 1) return via;
  const int to = StageOfChunk(schedule, to_chunk, p);
  if (to == me) return {job_->turn_link.get(), Peer::kDownstream};
  via.peer = to > me ? Peer::kDownstream : Peer::kUpstream;
  return via;
}

Status Stage::Impl::Send(StepState& st, v1::FrameKind kind, int to_chunk, int mb, const Tensors& ts,
                         const std::vector<int>& parts) {
  const int from_chunk = kind == v1::FRAME_ACTIVATION ? to_chunk - 1 : to_chunk + 1;
  Span span(st, v1::TraceEvent::SEND, from_chunk / job_->assignment.num_stages(), mb);
  const Route via = RouteTo(kind, to_chunk);
  for (std::size_t k = 0; k < ts.size(); ++k) {
    const at::Tensor& t = ts[k];
    Frame frame;
    v1::TensorFrame& h = frame.header;
    h.set_job_id(st.req->job_id());
    h.set_phase(st.req->phase());
    h.set_step(st.data_step);
    h.set_micro_batch(mb);
    h.set_kind(kind);
    h.set_chunk(to_chunk);
    h.set_from_stage(job_->assignment.stage_index());
    h.set_part(parts[k]);
    CONVEYOR_ASSIGN_OR_RETURN(v1::DType dtype, ToWireDType(t.scalar_type()));
    h.mutable_tensor()->set_dtype(dtype);
    for (int64_t d : t.sizes()) h.mutable_tensor()->add_shape(d);
    h.mutable_tensor()->set_channels_last(SendsChannelsLast(t));
    frame.payload = MakeTensorPayload(t);
    CONVEYOR_RETURN_IF_ERROR(Annotate(via.link->Send(via.peer, std::move(frame)), Who()));
  }
  return absl::OkStatus();
}

Status Stage::Impl::Forward(StepState& st, int local, int mb) {
  Chunk& c = job_->chunks[local];
  const bool first = job_->IsFirst(c), last = job_->IsLast(c);
  const int64_t rows = st.sizes[mb];
  Tensors x;
  if (first) {
    x.push_back(st.inputs.narrow(0, st.offsets[mb], rows));
  } else {
    CONVEYOR_ASSIGN_OR_RETURN(x, Receive(st, v1::FRAME_ACTIVATION, local, mb));
    if (st.train)
      for (int i : PartsOf(c.inputs, /*all=*/false)) x[static_cast<std::size_t>(i)].requires_grad_(true);
  }
  Held h;
  h.inputs = x;
  h.scale = static_cast<double>(rows) / static_cast<double>(st.req->batch_size() * st.accumulate);
  Tensors out;
  if (st.graphed) {
    Span span(st, v1::TraceEvent::FORWARD, local, mb);
    GraphedPasses::Head head;
    at::Tensor labels;
    if (last) {
      labels = st.labels.narrow(0, st.offsets[mb], rows);
      const double scale = h.scale;
      head = [this, scale](const at::Tensor& o, const at::Tensor& l) { return ComputeLoss(job_->spec(), o, l, scale); };
    }
    auto f = job_->graphs->Forward(local, mb, *c.layers, x.front(), !first, labels, head);
    if (!f.ok()) return Annotate(f.status(), Who());
    h.inputs = {f->input};
    h.outputs = {f->output};
    if (last) {
      st.AddLoss(f->output);
    } else {
      out = {f->output};
    }
  } else {
    Span span(st, v1::TraceEvent::FORWARD, local, mb);
    // Recomputing stages keep only the chunk's input; the forward runs again in backward.
    std::optional<at::NoGradGuard> no_grad;
    if (job_->recompute && st.train) no_grad.emplace();
    {
      ForwardPrecision precision(job_->spec(), device_);
      CONVEYOR_ASSIGN_OR_RETURN(out, RunLayers(st, c, mb, x));
    }
    if (last) {
      h.labels = st.labels.narrow(0, st.offsets[mb], rows);
      at::Tensor loss = ComputeLoss(job_->spec(), out.front(), h.labels, h.scale);
      st.AddLoss(loss);
      if (!st.train) {
        st.correct += CountCorrect(out.front(), h.labels);
        st.predictions += h.labels.numel();
      }
      if (!job_->recompute) h.outputs = {ScaledLoss(st, loss)};
    } else if (!job_->recompute) {
      h.outputs = out;
    }
  }
  if (!last) {
    CONVEYOR_RETURN_IF_ERROR(Send(st, v1::FRAME_ACTIVATION, c.index + 1, mb, out, PartsOf(c.outputs, /*all=*/true)));
  }
  if (st.train) {
    h.bytes = Bytes(h.inputs) + Bytes(h.outputs);
    st.held_bytes += h.bytes;
    st.held.emplace(std::make_pair(local, mb), std::move(h));
    st.peak_count = std::max<int64_t>(st.peak_count, static_cast<int64_t>(st.held.size()));
    st.peak_bytes = std::max(st.peak_bytes, st.held_bytes);
  }
  return absl::OkStatus();
}

at::Tensor Stage::Impl::ScaledLoss(const StepState& st, const at::Tensor& loss) const {
  const double scale = st.train ? st.req->loss_scale() : 0;
  return scale > 0 && scale != 1 ? loss * scale : loss;
}

StatusOr<Tensors> Stage::Impl::RunLayers(StepState& st, Chunk& c, int mb, const Tensors& x) {
  // Dropout draws from (seed, step, micro-batch, layer), in a recomputed
  // forward as in the first.
  std::optional<Partition::RandomKey> key;
  if (st.train) key = Partition::RandomKey{job_->spec().seed(), st.data_step, mb};  // the batch, under accumulate_steps
  c.layers->SetRandomKey(key);
  CONVEYOR_ASSIGN_OR_RETURN(Tensors out, c.layers->Forward(x));
  if (job_->IsLast(c) && out.size() != 1) {
    return absl::InvalidArgumentError(Who() + ": the model's last layer returns " + std::to_string(out.size()) +
                                      " tensors; the loss takes one");
  }
  if (!job_->IsLast(c) && out.size() != c.outputs.size()) {
    return absl::InvalidArgumentError(Who() + " micro-batch " + std::to_string(mb) + ": chunk " +
                                      std::to_string(c.index) + " returns " + std::to_string(out.size()) +
                                      " tensors, the shape probe found " + std::to_string(c.outputs.size()));
  }
  return out;
}

void Stage::Impl::Release(StepState& st, std::map<std::pair<int, int>, Held>::iterator it) {
  st.held_bytes -= it->second.bytes;
  st.held.erase(it);
}

Status Stage::Impl::Backward(StepState& st, int local, int mb, bool input_grad_only) {
  Chunk& c = job_->chunks[local];
  const bool first = job_->IsFirst(c), last = job_->IsLast(c);
  auto it = st.held.find({local, mb});
  if (it == st.held.end())
    return absl::InternalError(Who() + ": backward before forward of micro-batch " + std::to_string(mb));
  Held& h = it->second;
  Tensors grads;  // of the outputs that require grad, in order
  if (!last) {
    CONVEYOR_ASSIGN_OR_RETURN(grads, Receive(st, v1::FRAME_GRADIENT, local, mb));
  }
  if (h.outputs.empty()) CONVEYOR_RETURN_IF_ERROR(RecomputeForward(st, local, mb, h));
  // The inputs that send a gradient back.
  const std::vector<int> input_parts = first ? std::vector<int>{} : PartsOf(c.inputs, /*all=*/false);
  CONVEYOR_ASSIGN_OR_RETURN(Tensors input_grads, BackwardPass(st, local, mb, h, grads, input_parts, input_grad_only));
  if (!input_parts.empty()) {
    for (std::size_t k = 0; k < input_parts.size(); ++k)
      if (!input_grads[k].defined()) input_grads[k] = at::zeros_like(h.inputs[static_cast<std::size_t>(input_parts[k])]);
    CONVEYOR_RETURN_IF_ERROR(Send(st, v1::FRAME_GRADIENT, c.index - 1, mb, input_grads, input_parts));
  }
  if (input_grad_only) {
    const int64_t kept = h.split ? h.split->kept_bytes() : 0;
    st.held_bytes += kept;
    h.bytes += kept;
    st.peak_bytes = std::max(st.peak_bytes, st.held_bytes);
  } else {
    Release(st, it);
  }
  return absl::OkStatus();
}

Status Stage::Impl::RecomputeForward(StepState& st, int local, int mb, Held& h) {
  Chunk& c = job_->chunks[local];
  Span span(st, v1::TraceEvent::RECOMPUTE, local, mb);
  // The first forward updated the buffers (BatchNorm's running statistics
  // and count); the recomputed one leaves them as they were, so that they
  // are updated once per micro-batch, as without recompute.
  const std::vector<at::Tensor> buffers = c.layers->Buffers();
  std::vector<at::Tensor> kept;
  {
    at::NoGradGuard no_grad;
    for (const at::Tensor& b : buffers) kept.push_back(b.clone());
  }
  Tensors out;
  {
    ForwardPrecision precision(job_->spec(), device_);
    CONVEYOR_ASSIGN_OR_RETURN(out, RunLayers(st, c, mb, h.inputs));
  }
  {
    // Through .data(), which autograd does not version: BatchNorm's
    // backward keeps the buffers as inputs (it does not read them in training).
    at::NoGradGuard no_grad;
    for (std::size_t i = 0; i < buffers.size(); ++i) buffers[i].data().copy_(kept[i]);
  }
  h.outputs = job_->IsLast(c) ? Tensors{ScaledLoss(st, ComputeLoss(job_->spec(), out.front(), h.labels, h.scale))}
                              : std::move(out);
  return absl::OkStatus();
}

StatusOr<Tensors> Stage::Impl::BackwardPass(StepState& st, int local, int mb, Held& h, const Tensors& grads,
                                            const std::vector<int>& input_parts, bool input_grad_only) {
  Chunk& c = job_->chunks[local];
  const bool last = job_->IsLast(c);
  const std::vector<int> grad_parts = last ? std::vector<int>{0} : PartsOf(c.outputs, /*all=*/false);
  // What backward starts from: the outputs that require grad, with theirs.
  Tensors roots, root_grads;
  for (std::size_t k = 0; k < grad_parts.size(); ++k) {
    const at::Tensor& o = h.outputs[static_cast<std::size_t>(grad_parts[k])];
    if (!o.requires_grad()) continue;
    roots.push_back(o);
    if (!last) root_grads.push_back(grads[k]);
  }
  Tensors input_grads(input_parts.size());
  Span span(st, v1::TraceEvent::BACKWARD, local, mb);
  if (!roots.empty() && st.graphed) {
    auto g = job_->graphs->Backward(local, mb, last ? at::Tensor() : root_grads.front(), c.params);
    if (!g.ok()) return Annotate(g.status(), Who());
    if (!input_grads.empty()) input_grads.front() = *g;
  } else if (!roots.empty()) {
    if (input_grad_only) {
      // Zero-bubble: the input gradients now, the weights' in WeightPass
      // from the gradients kept where the two paths part (split_backward.h).
      Tensors wanted, params;
      for (int i : input_parts) wanted.push_back(h.inputs[static_cast<std::size_t>(i)]);
      for (const auto& p : c.params)
        if (p.requires_grad()) params.push_back(p);
      input_grads = SplitBackward::InputPass(roots, root_grads, wanted, params, &h.split);
      h.outputs.clear();
    } else {
      torch::autograd::backward(roots, root_grads);
      for (std::size_t k = 0; k < input_parts.size(); ++k)
        input_grads[k] = h.inputs[static_cast<std::size_t>(input_parts[k])].grad();
    }
  } else if (input_grad_only) {
    h.outputs.clear();  // nothing for the weight pass
  }
  return input_grads;
}

Status Stage::Impl::WeightPass(StepState& st, int local, int mb) {
  auto it = st.held.find({local, mb});
  if (it == st.held.end())
    return absl::InternalError(Who() + ": weight pass without backward of micro-batch " + std::to_string(mb));
  Held& h = it->second;
  {
    Span span(st, v1::TraceEvent::WEIGHT, local, mb);
    if (h.split) h.split->WeightPass();
  }
  Release(st, it);
  return absl::OkStatus();
}

bool Stage::Impl::FrameReady(const Action& act) const {
  const Chunk& c = job_->chunks[static_cast<std::size_t>(act.chunk)];
  switch (act.type) {
    case ActionType::kForward:
      return job_->IsFirst(c) || inbox_.Ready(v1::FRAME_ACTIVATION, c.index, act.micro_batch);
    case ActionType::kBackward:
      return job_->IsLast(c) || inbox_.Ready(v1::FRAME_GRADIENT, c.index, act.micro_batch);
    case ActionType::kWeight:
      break;
  }
  return true;
}

Status Stage::Impl::RunActions(StepState& st) {
  const v1::JobSpec& spec = job_->spec();
  const v1::StageAssignment& a = job_->assignment;
  const int m = static_cast<int>(st.sizes.size());
  const int local_chunks = static_cast<int>(job_->chunks.size());
  std::vector<Action> actions;
  if (st.train) {
    CONVEYOR_ASSIGN_OR_RETURN(actions, BuildSchedule(spec.schedule(), a.stage_index(), a.num_stages(), m, local_chunks));
  } else {
    actions = ForwardOnly(m, local_chunks);
  }
  const bool zero_bubble = st.train && SplitsBackward(spec.schedule());
  const bool last_batch = st.data_step % st.accumulate == st.accumulate - 1;  // of the optimizer step
  // replicas: each chunk's last backward (or weight) pass of the optimizer
  // step gives its final gradients, all-reduced bucket by bucket as they come.
  // Replayed passes run no hooks (and a recorded one must not hold a
  // collective): the buckets are all-reduced after them, all at once.
  const bool reduce = st.train && job_->reducer && last_batch;
  std::vector<int> arm_at(actions.size(), -1);  // action -> the local chunk to arm before it
  if (reduce) job_->reducer->Reset();
  if (reduce && !st.graphed) {
    std::vector<int> last(static_cast<std::size_t>(local_chunks), -1);
    for (std::size_t i = 0; i < actions.size(); ++i)
      if (actions[i].type != ActionType::kForward) last[static_cast<std::size_t>(actions[i].chunk)] = static_cast<int>(i);
    for (int c = 0; c < local_chunks; ++c)
      if (last[static_cast<std::size_t>(c)] >= 0) arm_at[static_cast<std::size_t>(last[static_cast<std::size_t>(c)])] = c;
  }
  std::string doing;
  std::vector<bool> done(actions.size(), false);
  auto run = [&](std::size_t i) -> Status {
    const Action& act = actions[i];
    doing = std::string(act.type == ActionType::kForward ? "forward" : act.type == ActionType::kBackward ? "backward" : "weight pass") +
            " of micro-batch " + std::to_string(act.micro_batch);
    if (arm_at[i] >= 0) {
      const std::size_t c = static_cast<std::size_t>(arm_at[i]);
      CONVEYOR_RETURN_IF_ERROR(job_->reducer->Arm(job_->chunk_params[c], job_->chunk_params[c + 1]));
    }
    done[i] = true;
    switch (act.type) {
      case ActionType::kForward: return Forward(st, act.chunk, act.micro_batch);
      case ActionType::kBackward: return Backward(st, act.chunk, act.micro_batch, zero_bubble);
      case ActionType::kWeight: return WeightPass(st, act.chunk, act.micro_batch);
    }
    return absl::OkStatus();
  };
  try {
    for (std::size_t i = 0; i < actions.size(); ++i) {
      if (done[i]) continue;
      // Zero-bubble (ZB-H1): while the frame this action waits for has not
      // come, run the weight passes due later whose backward is done, in the
      // list's order (so the gradients add up in the same order, whatever the
      // timing): the wait is the bubble they fill.
      for (std::size_t j = i + 1; zero_bubble && !FrameReady(actions[i]) && j < actions.size(); ++j) {
        if (done[j] || actions[j].type != ActionType::kWeight) continue;
        auto held = st.held.find({actions[j].chunk, actions[j].micro_batch});
        if (held == st.held.end() || !held->second.split) break;  // its backward has not run
        CONVEYOR_RETURN_IF_ERROR(run(j));
      }
      CONVEYOR_RETURN_IF_ERROR(run(i));
    }
    if (reduce) {
      doing = "all-reduce of the gradients";
      CONVEYOR_RETURN_IF_ERROR(AllReduceGradients(st));
      doing = "broadcast of the buffers";
      CONVEYOR_RETURN_IF_ERROR(BroadcastBuffers());
    }
    if (st.train && job_->optimizer && last_batch) {
      doing = "optimizer step";
      Span span(st, v1::TraceEvent::OPTIMIZER, 0, -1);
      CONVEYOR_RETURN_IF_ERROR(PrepareUpdate(st));
    }
  } catch (const std::exception& e) {  // c10::Error, std::bad_alloc, StatusError
    return TorchFailure(e, absl::StatusCode::kInternal, Who() + " step " + std::to_string(st.req->step()) + ", " + doing,
                        &st);
  }
  return absl::OkStatus();
}

Status Stage::Impl::LoadBatch(StepState& st) {
  const v1::RunStepRequest& req = *st.req;
  if (job_->loader && job_->data->train_size() > 0) {
    BatchLoader::Batch batch = job_->loader->Get(req.phase(), st.data_step);
    st.inputs = std::move(batch.inputs);
    st.labels = std::move(batch.labels);
    // The next batch is gathered on the host while this one is launched.
    job_->loader->Prefetch(req.phase(), st.data_step + 1);
  }
  int64_t rows = 0;  // this replica's share of the batch
  for (int64_t n : st.sizes) rows += n;
  if ((st.inputs.defined() && st.inputs.size(0) != rows) || (st.labels.defined() && st.labels.size(0) != rows)) {
    return absl::FailedPreconditionError(Who() + ": the data gives a different batch size than " +
                                         std::to_string(rows) + " for step " + std::to_string(req.step()));
  }
  return absl::OkStatus();
}

Status Stage::Impl::FinishOnDevice(StepState& st) {
  if (!device_.is_cuda()) {
    if (job_->transport) return Annotate(job_->transport->status(), Who());
    return absl::OkStatus();
  }
  c10::Event done(device_.type());
  done.record(c10::impl::VirtualGuardImpl(device_.type()).getStream(device_));
  return AwaitDevice(done, job_->transport.get(), st.clock, st.timeout, Who(), st.req->step(), /*beside=*/false);
}

Status Stage::Impl::AwaitDevice(const c10::Event& done, Transport* transport, DeviceClock::Marks* marks,
                                SteadyClock::duration timeout, const std::string& who, int64_t step, bool beside,
                                const std::function<Status(const Status&)>& collectives) {
  // The device may wait for NCCL transfers that a broken link never ends:
  // the host polls instead of blocking, so that it sees the link break (and
  // the transfers end, aborted) rather than hang in a synchronize. The host
  // may have queued the whole step: stage_timeout bounds the wait for the
  // device's next mark, not for all of them. `beside`: the executor launches
  // the next step meanwhile, and queries in a tight loop would contend with
  // its launches for the driver: one every 100 us (the reply's delay is
  // hidden behind the step queued after this one).
  auto last_progress = Now();
  int passed = 0;
  for (int spins = beside ? 1000 : 0; !done.query(); ++spins) {
    if (transport) CONVEYOR_RETURN_IF_ERROR(Annotate(transport->status(), who));
    if (collectives) CONVEYOR_RETURN_IF_ERROR(collectives(absl::OkStatus()));
    {
      std::lock_guard<std::mutex> lock(info_mu_);
      if (!aborted_.empty()) return absl::AbortedError(aborted_);
    }
    const int now_passed = marks ? marks->Passed() : 0;
    if (now_passed > passed) {
      passed = now_passed;
      last_progress = Now();
    }
    if (Now() - last_progress > timeout)
      return absl::DeadlineExceededError(who + ": the device made no progress on step " + std::to_string(step) +
                                         " within stage_timeout");
    if (spins < 1000) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(beside ? 100 : 50));
    }
  }
  // A transfer that ended because its link broke ended early: check again.
  if (transport) return Annotate(transport->status(), who);
  return absl::OkStatus();
}

bool Stage::Impl::UseGraphs(const v1::RunStepRequest& req) const {
  if (!job_->graphs || req.batch_size() != job_->spec().batch_size()) return false;
  // One step first runs as it is (lazy initialisation, kernel choices, the
  // allocator's pools), and a profiled step is not the one that records.
  if (job_->graphs_recorded) return true;
  return job_->trained_eagerly && job_->spec().profile_step() != req.step() + 1;
}

std::unique_ptr<OpProfile> Stage::Impl::MaybeStartProfile(const v1::RunStepRequest& req) {
  if (req.phase() != v1::PHASE_TRAIN || job_->spec().profile_step() != req.step() + 1) return nullptr;
  if (ProfileDir().empty()) {
    LOG_WARN("job ", req.job_id(), " ", Who(), ": profile_step ", req.step() + 1,
             " asked, but this stage server has neither --profile-dir nor --checkpoint-dir: not profiled");
    return nullptr;
  }
  auto profile = OpProfile::Start(device_.is_cuda());
  if (!profile.ok()) {
    LOG_WARN("job ", req.job_id(), " ", Who(), ": not profiled: ", profile.status().message());
    return nullptr;
  }
  return std::move(*profile);
}

// A profile is a diagnosis: failing to write it is logged, and the step goes on.
void Stage::Impl::FinishProfile(std::unique_ptr<OpProfile> profile, int64_t step) {
  // Replicas: one file per copy of the stage (they share the folder).
  const v1::StageAssignment& a = job_->assignment;
  const std::string path =
      ProfilePath(ProfileDir(), a.job_id(), step,
                  "stage" + std::to_string(a.stage_index()) +
                      (a.num_replicas() > 1 ? "-replica" + std::to_string(a.replica()) : std::string()));
  Status st = profile->Finish(path);
  if (st.ok()) {
    LOG_INFO("job ", job_->assignment.job_id(), " ", Who(), ": profile of step ", step, " written to ", path);
  } else {
    LOG_WARN("job ", job_->assignment.job_id(), " ", Who(), ": ", st.message());
  }
}

namespace {

// Once the device is done: the device's own times for the compute spans of
// `reply`'s timeline; their sum in seconds (busy).
double DeviceTimes(DeviceClock::Marks& marks, const std::vector<DeviceSpan>& spans, v1::RunStepReply* reply) {
  const std::vector<int64_t> us = marks.HostUs();
  double busy = 0;
  for (const DeviceSpan& d : spans) {
    v1::TraceEvent* e = reply->mutable_events(d.event);
    e->set_start_us(us[d.start_mark]);
    e->set_end_us(us[d.end_mark]);
    busy += static_cast<double>(us[d.end_mark] - us[d.start_mark]) * 1e-6;
  }
  return busy;
}

}  // namespace

bool Stage::Impl::ReadsAfterUpdate(const v1::RunStepRequest& req) const {
  return device_.is_cuda() && req.phase() == v1::PHASE_TRAIN && !req.defer_update() && !(req.loss_scale() > 0);
}

Status Stage::Impl::AwaitTurn(const v1::RunStepRequest& req) {
  if (req.phase() != v1::PHASE_TRAIN) return absl::OkStatus();
  std::unique_lock<std::mutex> lock(info_mu_);
  // LaunchRunStep says what is wrong, without a wait for a turn that would
  // not come (a step of another job, or of an earlier configuration).
  if (job_id_ != req.job_id() || deployment_ != req.deployment()) return absl::OkStatus();
  auto turn = [&] {
    return next_train_step_ < 0 || req.step() <= next_train_step_ || !aborted_.empty() || job_id_ != req.job_id() ||
           deployment_ != req.deployment();
  };
  // The coordinator configures the job anew (or ends it) before it steps it again.
  if (!aborted_.empty()) return absl::AbortedError(aborted_);
  if (next_train_step_ < 0 || req.step() <= next_train_step_) return absl::OkStatus();  // its turn: no wait
  Clock& clock = options_.clock ? *options_.clock : RealClock();
  const double wait_s = stage_timeout_s_ > 0 ? stage_timeout_s_ : 60;
  if (!clock.WaitUntil(turn_cv_, lock, clock.After(wait_s), turn)) {
    return absl::DeadlineExceededError("stage " + std::to_string(stage_index_) + ": training step " +
                                       std::to_string(req.step()) + " came, but step " +
                                       std::to_string(next_train_step_) + " did not within stage_timeout");
  }
  if (!aborted_.empty()) return absl::AbortedError(aborted_);
  return absl::OkStatus();
}

StatusOr<Stage::Impl::StepEnd> Stage::Impl::LaunchRunStep(const v1::RunStepRequest& req) {
  CONVEYOR_RETURN_IF_ERROR(CheckRunStep(req));
  const bool train = req.phase() == v1::PHASE_TRAIN;
  const int accumulate = train ? AccumulateSteps(job_->spec()) : 1;
  CONVEYOR_RETURN_IF_ERROR(BeginRunStep(req, accumulate));
  StepEnd end;
  end.start = SteadyClock::now();
  end.who = Who();
  end.step = req.step();
  StepState st;
  PrepareStepState(st, req, &end.reply, accumulate);
  std::unique_ptr<OpProfile> profile;
  bool detach = false;
  Status status;
  try {
    if (train && job_->spec().commit_steps()) {
      KeepStepStart();
      job_->begun_step = req.step();
    }
    status = RunStepBatches(st, end, profile, &detach);
  } catch (const std::exception& e) {
    status = TorchFailure(e, absl::StatusCode::kInternal, Who() + " step " + std::to_string(req.step()), &st);
  }
  if (status.code() == absl::StatusCode::kResourceExhausted) FreeStep(st);
  if (!status.ok()) {
    LOG_WARN("job ", req.job_id(), " ", Who(), " step ", req.step(), " failed: ", status.message());
    return status;
  }
  return EndRunStep(st, end, detach);
}

Status Stage::Impl::CheckRunStep(const v1::RunStepRequest& req) const {
  CONVEYOR_RETURN_IF_ERROR(CheckJob(req.job_id()));
  CONVEYOR_RETURN_IF_ERROR(CheckDeployment(req.deployment(), "step " + std::to_string(req.step())));
  const v1::JobSpec& spec = job_->spec();
  if (req.phase() != v1::PHASE_TRAIN && req.phase() != v1::PHASE_EVAL)
    return absl::InvalidArgumentError(Who() + ": step without a phase");
  if (req.phase() == v1::PHASE_EVAL && !spec.eval())
    return absl::InvalidArgumentError(Who() + ": this job does not evaluate");
  const int64_t max_batch = req.phase() == v1::PHASE_TRAIN ? spec.batch_size() : spec.eval_batch_size();
  if (req.batch_size() < 1 || req.batch_size() > max_batch)
    return absl::InvalidArgumentError(Who() + ": batch_size " + std::to_string(req.batch_size()) +
                                      " is out of range [1, " + std::to_string(max_batch) + "]");
  if (req.step() < 0) return absl::InvalidArgumentError(Who() + ": negative step");
  if (job_->data && req.phase() == v1::PHASE_EVAL && req.step() >= job_->data->EvalBatches())
    return absl::InvalidArgumentError(Who() + ": eval batch " + std::to_string(req.step()) + " is past the test split");
  if (!job_->transport && job_->assignment.num_stages() > 1)
    return absl::FailedPreconditionError(Who() + ": not connected to its neighbours (call Connect first)");
  return absl::OkStatus();
}

Status Stage::Impl::BeginRunStep(const v1::RunStepRequest& req, int accumulate) {
  if (req.phase() == v1::PHASE_TRAIN) {  // the next step may launch once this one has begun (AwaitTurn)
    std::lock_guard<std::mutex> lock(info_mu_);
    next_train_step_ = std::max(next_train_step_, req.step() + 1);
    turn_cv_.notify_all();
  }
  inbox_.BeginStep(req.phase(), req.step() * accumulate);
  {
    // An Abort that came before this step began (BeginStep forgot it).
    std::lock_guard<std::mutex> lock(info_mu_);
    if (!aborted_.empty()) inbox_.Fail(absl::AbortedError(aborted_));
  }
  job_->pending_step = -1;  // a deferred update not applied is dropped
  if (job_->transport) CONVEYOR_RETURN_IF_ERROR(Annotate(job_->transport->status(), Who()));
  return absl::OkStatus();
}

void Stage::Impl::PrepareStepState(StepState& st, const v1::RunStepRequest& req, v1::RunStepReply* reply,
                                   int accumulate) {
  const v1::JobSpec& spec = job_->spec();
  st.req = &req;
  st.reply = reply;
  st.train = req.phase() == v1::PHASE_TRAIN;
  st.accumulate = accumulate;
  // A replica trains on its share of the batch; the losses stay scaled by
  // the whole batch (Forward), so the all-reduced sum is its gradient.
  const int64_t rows =
      st.train ? ShareOf(spec, req.batch_size(), job_->assignment.replica()).size : req.batch_size();
  st.sizes = MicroBatchSizes(spec, rows);
  st.offsets = {0};
  for (int64_t n : st.sizes) st.offsets.push_back(st.offsets.back() + n);
  st.timeout = std::chrono::duration_cast<SteadyClock::duration>(std::chrono::duration<double>(spec.stage_timeout_s()));
  // On a GPU a job's first training step may take far longer than the later
  // ones, here and on the neighbours (CUDA's libraries read from disk, cuDNN
  // timing every convolution shape): its waits get at least 300 s. A W1 stage
  // waited past stage_timeout (10 s) for its neighbour's first gradient on a
  // freshly started H100, and the job recovered (2x H100, 2026-11-26,
  // bench/RESULTS.md).
  if (device_.is_cuda() && st.train && !job_->trained_eagerly && !job_->graphs_recorded)
    st.timeout = std::max<SteadyClock::duration>(st.timeout, std::chrono::seconds(300));
  if (clock_) {
    st.marks = clock_->Begin(/*device_idle=*/steps_in_flight_.load() == 0);
    st.clock = st.marks.get();
  }
}

void Stage::Impl::ZeroStepGradients() {
  // Recorded graphs accumulate into the gradients they saw: zeroed in place.
  if (job_->reducer) {
    job_->reducer->ZeroGrads();  // the gradients are views of its buckets: in place
  } else if (job_->graphs) {
    for (const Chunk& c : job_->chunks) GraphedPasses::ZeroGrads(c.params);
  } else if (job_->optimizer) {
    job_->optimizer->zero_grad();
  }
}

bool Stage::Impl::DetachesStep(const StepState& st, bool profiled) const {
  const v1::RunStepRequest& req = *st.req;
  // It ends off the executor (FinishRunStep), while the next step launches:
  // with steps_in_flight 2, a training step that writes no checkpoint, is not
  // profiled, and whose update the coordinator does not decide (ApplyStep,
  // loss scaling). With replicas, where their sums run on the device (NCCL)
  // or not at all: the thread that waits for the step's end watches the
  // collectives (ReplicaGroup::Watcher), and none of the step waits for them
  // on the host.
  // Under cuda_graphs only a replay: the steps before the recording one,
  // and the recording one, end on the executor, so that nothing of another
  // step runs on the device while graphs are captured. Nor a stage with
  // NCCL links: W1 over two H200s (1f1b and gpipe, 4 micro-batches of 15
  // MB, graphs) hung with the next step launched behind a replayed one, its
  // transfers never matched; the cause is not found (bench/RESULTS.md).
  // Such a stage still has the next request queued when its step ends.
  const bool replay = !job_->graphs || (st.graphed && job_->graphs_recorded);
  const bool collectives_on_device =
      job_->assignment.num_replicas() <= 1 ||
      (device_.is_cuda() && job_->replica_group && job_->replica_group->on_device());
  return st.train && StepsInFlight(job_->spec()) > 1 && replay && NcclLinks() == 0 && !profiled &&
         !req.checkpoint() && !req.defer_update() && !(req.loss_scale() > 0) && collectives_on_device;
}

Status Stage::Impl::RunStepBatches(StepState& st, StepEnd& end, std::unique_ptr<OpProfile>& profile,
                                   bool* detach) {
  const v1::RunStepRequest& req = *st.req;
  std::optional<at::NoGradGuard> no_grad;
  for (Chunk& c : job_->chunks) c.layers->Train(st.train);
  if (st.train) {
    ZeroStepGradients();
    st.graphed = UseGraphs(req);
  } else {
    no_grad.emplace();
  }
  profile = MaybeStartProfile(req);
  *detach = DetachesStep(st, profile != nullptr);
  if (job_->replica_group) job_->replica_group->DeferConfirm(*detach);
  struct Undefer {
    ReplicaGroup* group;
    ~Undefer() {
      if (group) group->DeferConfirm(false);
    }
  } undefer{job_->replica_group.get()};
  // accumulate_steps: the action list once per batch, gradients summed; the
  // optimizer step after the last one (RunActions).
  Status status;
  for (int k = 0; k < st.accumulate && status.ok(); ++k) {
    st.data_step = req.step() * st.accumulate + k;
    if (k > 0) inbox_.BeginStep(req.phase(), st.data_step);
    status = LoadBatch(st);
    if (status.ok()) status = RunActions(st);
  }
  if (status.ok() && st.train) {
    if (st.graphed) {
      job_->graphs_recorded = true;
    } else {
      job_->trained_eagerly = true;
    }
    st.reply->set_graphed(st.graphed);
  }
  if (status.ok() && *detach) {
    CopyStepFigures(st, end);
  } else if (status.ok()) {
    status = FinishOnDevice(st);
  }
  if (profile) FinishProfile(std::move(profile), req.step() + 1);
  if (status.ok() && !*detach) ReadStepFigures(st);
  return status;
}

void Stage::Impl::CopyStepFigures(StepState& st, StepEnd& end) {
  // The figures the reply needs, copied to the host behind the step's
  // work (a graph's loss buffer is the next replay's), and an event
  // after them: FinishRunStep waits for it.
  at::Tensor loss = st.loss_total.defined() ? st.loss_total.reshape({1}).to(at::kDouble)
                                            : at::zeros({1}, at::TensorOptions(at::kDouble).device(device_));
  at::Tensor sq;
  if (st.sq.defined()) {
    sq = st.sq.reshape({1}).to(at::kDouble);
  } else {
    sq = at::full({1}, st.reply->grad_sq_norm(), at::TensorOptions(at::kDouble).device(device_));
  }
  at::Tensor both = at::cat({loss, sq});
  if (device_.is_cuda()) {
    end.figures = at::empty({2}, at::TensorOptions(at::kDouble).pinned_memory(true));
    end.figures.copy_(both, /*non_blocking=*/true);
    end.done = std::make_unique<c10::Event>(device_.type());
    end.done->record(c10::impl::VirtualGuardImpl(device_.type()).getStream(device_));
  } else {
    end.figures = both.clone();
  }
}

void Stage::Impl::ReadStepFigures(StepState& st) {
  if (st.loss_total.defined()) st.loss_sum = st.loss_total.item<double>();
  if (st.sq.defined()) {
    const double sq = st.sq.item<double>();
    st.reply->set_grad_sq_norm(sq);
    // Found after the update: no checkpoint of it (the coordinator fails the job).
    if (!std::isfinite(sq) || !std::isfinite(st.loss_sum)) st.skipped = true;
  }
  if (st.clock) st.busy += DeviceTimes(*st.clock, st.device_spans, st.reply);
}

StatusOr<Stage::Impl::StepEnd> Stage::Impl::EndRunStep(StepState& st, StepEnd& end, bool detach) {
  const v1::RunStepRequest& req = *st.req;
  v1::RunStepReply& reply = end.reply;
  reply.set_correct(st.correct);
  reply.set_samples(st.train || st.predictions == 0 ? req.batch_size() : st.predictions);
  reply.set_peak_activations(st.peak_count);
  reply.set_peak_activation_bytes(st.peak_bytes);
  if (st.train) ReportMemory(&reply);
  if (detach) {
    end.waiting = true;
    end.marks = std::move(st.marks);
    end.device_spans = std::move(st.device_spans);
    end.host_busy = st.busy;
    end.transport = job_->transport;
    if (job_->replica_group) end.collectives = job_->replica_group->Watcher();
    end.timeout = st.timeout;
    ++steps_in_flight_;
    return std::move(end);
  }
  reply.set_loss_sum(st.loss_sum);
  reply.set_busy_seconds(st.busy);
  if (st.train && req.checkpoint() && !req.defer_update() && !st.skipped) {
    CONVEYOR_ASSIGN_OR_RETURN(*reply.mutable_checkpoint(), CheckpointAfter(req.step()));
  }
  reply.set_step_seconds(std::chrono::duration<double>(SteadyClock::now() - end.start).count());
  return std::move(end);
}

StatusOr<v1::RunStepReply> Stage::Impl::FinishRunStep(StepEnd end) {
  if (!end.waiting) return std::move(end.reply);
  struct Ended {  // the device's queue no longer holds this step
    std::atomic<int>& n;
    ~Ended() { --n; }
  } ended{steps_in_flight_};
  v1::RunStepReply& reply = end.reply;
  if (end.done) {
    Status waited = AwaitDevice(*end.done, end.transport.get(), end.marks.get(), end.timeout, end.who, end.step,
                                /*beside=*/true, end.collectives);
    // The step's collectives may still run (or wait for a replica that is
    // gone): the group is aborted, so that the device does not wait forever.
    if (!waited.ok() && end.collectives) end.collectives(waited).IgnoreError();
    CONVEYOR_RETURN_IF_ERROR(waited);
  } else if (end.transport) {
    CONVEYOR_RETURN_IF_ERROR(Annotate(end.transport->status(), end.who));
  }
  const double* figures = end.figures.data_ptr<double>();
  reply.set_loss_sum(figures[0]);
  reply.set_grad_sq_norm(figures[1]);
  reply.set_busy_seconds(end.host_busy + (end.marks ? DeviceTimes(*end.marks, end.device_spans, &reply) : 0.0));
  reply.set_step_seconds(std::chrono::duration<double>(SteadyClock::now() - end.start).count());
  return std::move(reply);
}

}  // namespace conveyor
