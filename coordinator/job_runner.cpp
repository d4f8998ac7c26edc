#include "coordinator/job_runner.h"

#include <chrono>

#include "common/sha256.h"
#include "plan/job_spec.h"
#include "common/logging.h"
#include "plan/model_catalog.h"
#include "common/wire.h"
#include "coordinator/job_store.h"

namespace conveyor {
namespace {
// "stage N: " before a stage's error, unless the stage named itself already
// (stage servers do, for their own logs): a message names its stage once.
Status ForStage(const Status& st, int64_t stage) {
  if (st.ok()) return st;
  const std::string who = "stage " + std::to_string(stage);
  const auto m = st.message();
  if (m.substr(0, who.size()) == who && m.size() > who.size() && (m[who.size()] == ':' || m[who.size()] == ' '))
    return st;
  return Annotate(st, who);
}

using Clock = std::chrono::steady_clock;

// Generous: a step's own waits are bounded by stage_timeout on the stages,
// and a vanished stage breaks the call through keepalive long before this.
constexpr double kStepDeadlineS = 3600;
constexpr double kControlDeadlineS = 600;
constexpr double kAbortDeadlineS = 5;

}  // namespace

JobRunner::JobRunner(v1::JobStatus status, v1::JobSpec spec, std::vector<StageClient*> stages, JobStore* store,
                     StatusSink sink)
    : status_(std::move(status)),
      spec_(std::move(spec)),
      stages_(std::move(stages)),
      store_(store),
      sink_(std::move(sink)),
      pool_(static_cast<int>(std::max<std::size_t>(1, stages_.size()))) {}

void JobRunner::Cancel(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(reason_mu_);
    if (cancel_reason_.empty()) cancel_reason_ = reason;
    cancelled_ = true;
  }
  cancel_cv_.notify_all();
  AbortAll(reason);
}

void JobRunner::Event(const std::string& text) {
  AddStatusEvent(&status_, text);
  if (store_) store_->AddEvent(status_.job_id(), text).IgnoreError();
}

void JobRunner::AbortAll(const std::string& reason) {
  v1::AbortRequest req;
  req.set_job_id(status_.job_id());
  req.set_reason(reason);
  for (StageClient* s : stages_) s->Abort(req, kAbortDeadlineS).IgnoreError();
}

void JobRunner::Publish() {
  if (sink_) sink_(status_);
}

Status JobRunner::BalancePartition() {
  v1::PartitionSpec* part = spec_.mutable_partition();
  const int chunks = part->stages() * std::max(1, spec_.virtual_stages());
  if (part->boundaries_size() > 0 || chunks == 1 ||
      (part->balance() != v1::BALANCE_PARAMS && part->balance() != v1::BALANCE_TIME)) {
    return absl::OkStatus();
  }
  v1::ProfileRequest req;
  *req.mutable_spec() = spec_;
  req.set_time(part->balance() == v1::BALANCE_TIME);
  auto reply = stages_[0]->Profile(req, kControlDeadlineS);
  if (!reply.ok()) return Annotate(reply.status(), "stage 0 profiling the model");
  std::vector<double> costs;
  for (const auto& layer : reply->layers())
    costs.push_back(req.time() ? layer.seconds() : static_cast<double>(layer.parameters()));
  if (static_cast<int>(costs.size()) < chunks) return absl::InvalidArgumentError("more chunks than layers");
  std::string cut;
  const int micro_batches = static_cast<int>(MicroBatchSizes(spec_, spec_.batch_size()).size());
  for (int b : ScheduledBoundaries(costs, spec_.schedule(), part->stages(), micro_batches,
                                   std::max(1, spec_.virtual_stages()))) {
    part->add_boundaries(b);
    cut += (cut.empty() ? "" : ", ") + std::to_string(b);
  }
  LOG_INFO("job ", status_.job_id(), ": balanced by ", req.time() ? "time" : "parameters", ", boundaries [", cut, "]");
  return absl::OkStatus();
}

v1::JobRef JobRunner::Ref() const {
  v1::JobRef ref;
  ref.set_job_id(status_.job_id());
  return ref;
}

StatusOr<std::vector<v1::StageInfo>> JobRunner::InfoAll() {
  std::vector<v1::StageInfo> infos;
  for (std::size_t s = 0; s < stages_.size(); ++s) {
    // Fails at once on a refused connection: a job does not wait for a stage
    // server that is not there (a resumed job waits in recovery instead).
    auto info = stages_[s]->Ping(spec_.stage_timeout_s());
    if (!info.ok()) return ForStage(info.status(), s);
    infos.push_back(std::move(*info));
  }
  return infos;
}

StatusOr<std::vector<v1::LinkSetup>> JobRunner::PlanLinks(bool ring) {
  const int p = static_cast<int>(stages_.size());
  std::vector<v1::LinkSetup> upstream(p);
  const v1::TransportKind want = spec_.transport() == v1::TRANSPORT_UNSPECIFIED ? v1::TRANSPORT_AUTO : spec_.transport();
  if (p == 1 || want == v1::TRANSPORT_GRPC) return upstream;
  CONVEYOR_ASSIGN_OR_RETURN(std::vector<v1::StageInfo> infos, InfoAll());
  auto gpu = [](const std::string& device) { return device == "cuda" ? std::string("cuda:0") : device; };
  for (int s = 0; s < (ring ? p : p - 1); ++s) {
    const int d = (s + 1) % p;
    const std::string link = "stage " + std::to_string(s) + " -> stage " + std::to_string(d);
    std::string why;
    for (int e : {s, d}) {
      if (why.empty() && !infos[e].nccl()) {
        why = "stage " + std::to_string(e) + " is on " + infos[e].device() +
              (infos[e].device().rfind("cuda", 0) == 0 ? " in a server built without NCCL" : ", not a CUDA device");
      }
    }
    if (why.empty() && gpu(infos[s].device()) == gpu(infos[d].device()))
      why = "both stages are on " + gpu(infos[s].device());
    if (!why.empty()) {
      if (want == v1::TRANSPORT_NCCL)
        return absl::FailedPreconditionError("transport nccl: the link " + link + " cannot use NCCL: " + why);
      LOG_INFO("job ", status_.job_id(), ": link ", link, " uses gRPC (", why, ")");
      continue;
    }
    v1::JobRef ref = Ref();
    auto setup = stages_[s]->PrepareLink(ref, kControlDeadlineS);
    if (!setup.ok()) return Annotate(setup.status(), "link " + link);
    upstream[d] = *setup;
  }
  return upstream;
}

Status JobRunner::DescribeFiles() {
  const bool script = spec_.model().kind() == v1::MODEL_TORCHSCRIPT;
  const bool data_files = spec_.data().kind() == v1::DATA_TENSORS || spec_.data().kind() == v1::DATA_TOKENS;
  if (!script && !data_files) return absl::OkStatus();
  // Stage 0 reads the archive and the data file; what it finds completes the
  // spec that every stage then gets.
  auto reply = stages_[0]->Describe(spec_, kControlDeadlineS);
  if (!reply.ok()) return ForStage(reply.status(), 0);
  ApplyDescription(*reply, &spec_);
  LOG_INFO("job ", status_.job_id(), ": ", reply->num_layers(), " layers", script ? " in " + spec_.model().torchscript() : "");
  return ValidateJobSpec(spec_);  // now with the layer count: stages against layers, boundaries
}

Status JobRunner::Setup() {
  const int p = spec_.partition().stages();
  if (p > static_cast<int>(stages_.size())) {
    return absl::FailedPreconditionError("the job needs " + std::to_string(p) + " stages, the coordinator has " +
                                         std::to_string(stages_.size()));
  }
  stages_.resize(p);
  // Every stage must answer before any is configured: a dead address fails
  // the job within stage_timeout instead of hanging it.
  CONVEYOR_RETURN_IF_ERROR(InfoAll().status());
  CONVEYOR_RETURN_IF_ERROR(DescribeFiles());
  CONVEYOR_RETURN_IF_ERROR(BalancePartition());
  CONVEYOR_ASSIGN_OR_RETURN(std::vector<LayerRange> ranges, PartitionLayers(spec_));
  const int chunks = static_cast<int>(ranges.size());  // p * virtual_stages
  // Each chunk's shapes, probed along the chain on the stage that will hold it.
  std::vector<std::vector<int64_t>> shapes{InputSampleShape(spec_)};
  for (int c = 0; c < chunks; ++c) {
    v1::ProbeRequest probe;
    *probe.mutable_spec() = spec_;
    probe.set_layer_begin(ranges[c].begin);
    probe.set_layer_end(ranges[c].end);
    for (int64_t d : shapes.back()) probe.add_input_sample_shape(d);
    auto reply = stages_[c % p]->Probe(probe, kControlDeadlineS);
    if (!reply.ok()) return ForStage(reply.status(), c % p);
    shapes.emplace_back(reply->output_sample_shape().begin(), reply->output_sample_shape().end());
  }
  const bool ring = chunks > p;  // interleaved: the last stage feeds the first
  assignments_.clear();
  for (int s = 0; s < p; ++s) {
    v1::StageAssignment a;
    a.set_job_id(status_.job_id());
    *a.mutable_spec() = spec_;
    a.set_stage_index(s);
    a.set_num_stages(p);
    a.set_num_chunks(chunks);
    if (s > 0 || ring) a.set_upstream(stages_[(s + p - 1) % p]->address());
    if (s + 1 < p || ring) a.set_downstream(stages_[(s + 1) % p]->address());
    for (int c = s; c < chunks; c += p) {
      v1::ChunkAssignment* ca = a.add_chunks();
      ca->set_index(c);
      ca->set_layer_begin(ranges[c].begin);
      ca->set_layer_end(ranges[c].end);
      for (int64_t d : shapes[c]) ca->add_input_sample_shape(d);
      for (int64_t d : shapes[c + 1]) ca->add_output_sample_shape(d);
    }
    assignments_.push_back(std::move(a));
  }
  return absl::OkStatus();
}

Status JobRunner::Deploy() {
  CONVEYOR_RETURN_IF_ERROR(ConfigureAll());
  if (steps_per_epoch_ <= 0) return absl::InvalidArgumentError("batch_size is larger than the training split");
  status_.set_total_epochs(spec_.epochs());
  status_.set_total_steps(spec_.steps() > 0 ? spec_.steps() : spec_.epochs() * steps_per_epoch_);
  if (spec_.steps() > 0)
    status_.set_total_epochs(static_cast<int>((spec_.steps() + steps_per_epoch_ - 1) / steps_per_epoch_));
  if (busy_.empty()) {
    busy_.assign(stages_.size(), 0);
    wall_.assign(stages_.size(), 0);
  }
  return Restore();
}

Status JobRunner::ConfigureAll() {
  const int p = static_cast<int>(assignments_.size());
  const bool ring = assignments_.front().num_chunks() > p;
  // Keep what the stages measured so far; the rest is filled in anew.
  std::vector<v1::StageReport> before(status_.stages().begin(), status_.stages().end());
  status_.clear_stages();
  for (int s = 0; s < p; ++s) {
    const v1::StageAssignment& a = assignments_[s];
    auto reply = stages_[s]->Configure(a, kControlDeadlineS);
    if (!reply.ok()) return ForStage(reply.status(), s);
    if (s == 0) {
      steps_per_epoch_ = reply->train_samples() / spec_.batch_size();
      test_samples_ = reply->test_samples();
    }
    v1::StageReport* r = status_.add_stages();
    if (s < static_cast<int>(before.size())) *r = before[s];
    r->clear_chunks();
    for (const auto& ca : a.chunks()) r->add_chunks(ca.index());
    r->set_index(s);
    r->set_address(stages_[s]->address());
    r->set_layer_begin(a.chunks(0).layer_begin());
    r->set_layer_end(a.chunks(0).layer_end());
    r->set_device(reply->device());
    r->set_num_parameters(reply->num_parameters());
  }
  CONVEYOR_ASSIGN_OR_RETURN(std::vector<v1::LinkSetup> links, PlanLinks(ring));
  for (int s = 0; s < p; ++s) {
    v1::JobRef ref = Ref();
    *ref.mutable_upstream_link() = links[s];
    auto reply = stages_[s]->Connect(ref, kControlDeadlineS);
    if (!reply.ok()) return ForStage(reply.status(), s);
    status_.mutable_stages(s)->set_transport(s + 1 < p || ring ? reply->transport() : v1::LINK_NONE);
  }
  return absl::OkStatus();
}

Status JobRunner::LoadAll(int64_t step) {
  v1::LoadCheckpointRequest req;
  req.set_job_id(status_.job_id());
  req.set_step(step);
  std::vector<Status> results(stages_.size());
  std::vector<std::function<void()>> calls;
  for (std::size_t s = 0; s < stages_.size(); ++s) {
    calls.push_back([&, s] { results[s] = stages_[s]->LoadCheckpoint(req, kControlDeadlineS).status(); });
  }
  pool_.RunAll(calls);
  for (std::size_t s = 0; s < stages_.size(); ++s)
    if (!results[s].ok()) return ForStage(results[s], s);
  return absl::OkStatus();
}

Status JobRunner::Restore() {
  if (!store_ || spec_.checkpoint_every() == 0) {
    if (status_.step() > 0) Event("no checkpoints: the job starts again from step 0");
    status_.set_step(0);
    status_.clear_losses();
    return absl::OkStatus();
  }
  CONVEYOR_ASSIGN_OR_RETURN(std::vector<int64_t> complete,
                            store_->CompleteCheckpoints(status_.job_id(), static_cast<int>(stages_.size())));
  int64_t restored = 0;
  for (int64_t step : complete) {
    Status st = LoadAll(step);
    if (st.ok()) {
      restored = step;
      break;
    }
    if (!absl::IsDataLoss(st) && !absl::IsNotFound(st) && !absl::IsFailedPrecondition(st)) return st;
    // That checkpoint is damaged or gone on some stage: the previous one.
    LOG_WARN("job ", status_.job_id(), ": the checkpoint of step ", step, " cannot be used (", st.message(),
             "); trying the previous one");
    Event("the checkpoint of step " + std::to_string(step) + " cannot be used (" + std::string(st.message()) +
          "): using an older one");
    store_->DropCheckpoints(status_.job_id(), step).IgnoreError();
  }
  if (restored == 0 && !complete.empty()) {
    // Failed loads may have changed some stages: back to the initial parameters.
    CONVEYOR_RETURN_IF_ERROR(ConfigureAll());
  }
  if (restored == 0 && status_.step() > 0) {
    Event("no usable checkpoint: the job starts again from step 0");
  } else if (restored > 0) {
    Event("restored every stage from the checkpoint of step " + std::to_string(restored));
  }
  status_.set_step(restored);
  status_.set_checkpoint_step(restored);
  if (status_.losses_size() > restored) status_.mutable_losses()->Truncate(static_cast<int>(restored));
  return absl::OkStatus();
}

void JobRunner::KeepTrace(int64_t step, const std::vector<v1::RunStepReply>& replies, int64_t wall_us,
                          int64_t since_previous_us) {
  v1::StepTrace trace;
  trace.set_wall_us(wall_us);
  trace.set_since_previous_us(since_previous_us);
  trace.set_job_id(status_.job_id());
  trace.set_step(step);
  trace.set_schedule(spec_.schedule());
  trace.set_micro_batches(status_.micro_batches());
  trace.set_virtual_stages(spec_.virtual_stages());
  for (std::size_t s = 0; s < replies.size(); ++s) {
    v1::StageTrace* st = trace.add_stages();
    st->set_stage(static_cast<int>(s));
    st->set_step_us(static_cast<int64_t>(replies[s].step_seconds() * 1e6));
    *st->mutable_events() = replies[s].events();
  }
  std::lock_guard<std::mutex> lock(trace_mu_);
  traces_[step] = std::move(trace);
  // Keep the first steps (start-up) and the last ones (steady state).
  while (static_cast<int>(traces_.size()) > kFirstTraces + kLastTraces) {
    auto it = traces_.begin();
    std::advance(it, kFirstTraces);
    traces_.erase(it);
  }
  status_.clear_traced_steps();
  for (const auto& [k, v] : traces_) status_.add_traced_steps(k);
}

StatusOr<v1::StepTrace> FindTrace(const std::vector<v1::StepTrace>& traces, int64_t step) {
  if (traces.empty()) return absl::NotFoundError("no step of this job has a timeline yet");
  if (step < 0) return traces.back();
  std::string kept;
  for (const auto& t : traces) {
    if (t.step() == step) return t;
    kept += (kept.empty() ? "" : ", ") + std::to_string(t.step());
  }
  return absl::NotFoundError("step " + std::to_string(step) + " has no timeline; kept: " + kept);
}

StatusOr<v1::StepTrace> JobRunner::Trace(int64_t step) const { return FindTrace(Traces(), step); }

std::vector<v1::StepTrace> JobRunner::Traces() const {
  std::lock_guard<std::mutex> lock(trace_mu_);
  std::vector<v1::StepTrace> out;
  for (const auto& [k, v] : traces_) out.push_back(v);
  return out;
}

Status JobRunner::StepAll(const v1::RunStepRequest& req, std::vector<v1::RunStepReply>* replies) {
  const std::size_t p = stages_.size();
  replies->assign(p, v1::RunStepReply());
  std::vector<Status> results(p);
  std::mutex first_mu;  // guards first_failure
  int first_failure = -1;
  std::atomic<bool> failed{false};
  std::vector<std::function<void()>> calls;
  for (std::size_t s = 0; s < p; ++s) {
    calls.push_back([&, s] {
      if (failed) {  // another stage failed before this call began
        results[s] = absl::AbortedError("step aborted");
        return;
      }
      auto reply = stages_[s]->RunStep(req, kStepDeadlineS);
      if (reply.ok()) {
        (*replies)[s] = std::move(*reply);
        return;
      }
      results[s] = reply.status();
      bool first = false;
      {
        std::lock_guard<std::mutex> lock(first_mu);
        if (first_failure < 0 && !absl::IsAborted(reply.status()) && !absl::IsCancelled(reply.status())) {
          first_failure = static_cast<int>(s);
          first = true;
        }
      }
      if (first) {
        failed = true;
        AbortAll("stage " + std::to_string(s) + " failed");
        // A step call to a stage that is gone would otherwise wait for it.
        for (StageClient* c : stages_) c->CancelSteps();
      }
    });
  }
  pool_.RunAll(calls);
  if (first_failure >= 0) return ForStage(results[first_failure], first_failure);
  for (std::size_t s = 0; s < p; ++s)
    if (!results[s].ok()) return ForStage(results[s], s);
  return absl::OkStatus();
}

Status JobRunner::Train() {
  const int64_t total = status_.total_steps();
  const int64_t batch = spec_.batch_size();
  const int64_t every = spec_.checkpoint_every();
  const int64_t first = status_.step();  // > 0 when resumed from a checkpoint
  auto start = Clock::now();
  auto steady_start = start;
  const int64_t warmup = first + std::min<int64_t>(kWarmupSteps, total - first - 1);
  auto last_publish = Clock::time_point();
  std::vector<v1::RunStepReply> replies;
  started_ = true;
  // Epochs that a resumed run trains again are reported again; one that
  // ended where it resumes (a checkpoint at its end, a failure while it was
  // evaluated) is reported now, its time unknown.
  auto* epochs = status_.mutable_epochs();
  while (!epochs->empty() && epochs->rbegin()->epoch() * steps_per_epoch_ > first) epochs->RemoveLast();
  if (ByEpochs() && first > 0 && first % steps_per_epoch_ == 0 &&
      (epochs->empty() || epochs->rbegin()->epoch() * steps_per_epoch_ < first)) {
    CONVEYOR_RETURN_IF_ERROR(EndEpoch(first, first, Clock::duration::zero()));
  }
  auto epoch_start = Clock::now();
  int64_t epoch_first_step = first;
  auto previous_step_end = Clock::now();
  for (int64_t step = first; step < total; ++step) {
    if (cancelled_) return absl::CancelledError("cancelled");
    v1::RunStepRequest req;
    req.set_job_id(status_.job_id());
    req.set_phase(v1::PHASE_TRAIN);
    req.set_step(step);
    req.set_batch_size(batch);
    req.set_checkpoint(every > 0 && ((step + 1) % every == 0 || step + 1 == total));
    const auto step_start = Clock::now();
    CONVEYOR_RETURN_IF_ERROR(StepAll(req, &replies));
    const auto step_end = Clock::now();
    const v1::RunStepReply& last = replies.back();
    status_.add_losses(static_cast<float>(last.loss_sum()));
    status_.set_loss(static_cast<float>(last.loss_sum()));
    for (std::size_t s = 0; s < replies.size(); ++s) {
      busy_[s] += replies[s].busy_seconds();
      wall_[s] += replies[s].step_seconds();
      v1::StageReport* r = status_.mutable_stages(static_cast<int>(s));
      r->set_peak_activations(std::max(r->peak_activations(), replies[s].peak_activations()));
      if (replies[s].graphed()) r->set_graphed_steps(r->graphed_steps() + 1);
      r->set_peak_activation_bytes(std::max(r->peak_activation_bytes(), replies[s].peak_activation_bytes()));
      r->set_busy_fraction(wall_[s] > 0 ? busy_[s] / wall_[s] : 0);
      r->set_idle_fraction(wall_[s] > 0 ? std::max(0.0, 1 - busy_[s] / wall_[s]) : 0);
    }
    auto us = [](Clock::duration d) { return std::chrono::duration_cast<std::chrono::microseconds>(d).count(); };
    KeepTrace(step + 1, replies, us(step_end - step_start), step > first ? us(step_start - previous_step_end) : 0);
    previous_step_end = step_end;
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    const int64_t done = step + 1;
    status_.set_step(done);
    status_.set_epoch(static_cast<int>(step / steps_per_epoch_) + 1);
    status_.set_elapsed_seconds(elapsed);
    status_.set_samples_per_second(elapsed > 0 ? static_cast<double>((done - first) * batch) / elapsed : 0);
    status_.set_eta_seconds(elapsed / static_cast<double>(done - first) * static_cast<double>(total - done));
    if (done == warmup) steady_start = Clock::now();
    if (done > warmup) {
      const double steady = std::chrono::duration<double>(Clock::now() - steady_start).count();
      status_.set_steady_samples_per_second(static_cast<double>((done - warmup) * batch) / steady);
    }
    if (req.checkpoint()) {
      // Complete on every stage: from now on a recovery resumes here.
      std::vector<std::pair<int, v1::CheckpointRecord>> records;
      for (std::size_t s = 0; s < replies.size(); ++s) records.emplace_back(static_cast<int>(s), replies[s].checkpoint());
      status_.set_checkpoint_step(done);
      if (store_) {
        Status st = store_->RecordCheckpoints(status_, records);
        if (!st.ok()) LOG_ERROR("job ", status_.job_id(), ": recording the checkpoint of step ", done, ": ", st.message());
      }
      LOG_DEBUG("job ", status_.job_id(), ": checkpoint of step ", done, " complete on every stage");
    }
    // Publish at most ten times a second, and the last step.
    if (done == total || Clock::now() - last_publish > std::chrono::milliseconds(100)) {
      last_publish = Clock::now();
      Publish();
    }
    if (done % std::max<int64_t>(1, steps_per_epoch_ / 4) == 0 || done == total) {
      LOG_INFO("job ", status_.job_id(), " step ", done, "/", total, " loss ", last.loss_sum(), " ",
               static_cast<int64_t>(status_.samples_per_second()), " samples/s");
    }
    if (ByEpochs() && done % steps_per_epoch_ == 0) {
      CONVEYOR_RETURN_IF_ERROR(EndEpoch(epoch_first_step, done, Clock::now() - epoch_start));
      epoch_start = Clock::now();
      epoch_first_step = done;
    }
  }
  return absl::OkStatus();
}

Status JobRunner::EndEpoch(int64_t first_step, int64_t done, Clock::duration took) {
  const double seconds = std::chrono::duration<double>(took).count();
  v1::EpochReport e =
      EpochSummary(status_.losses(), done, steps_per_epoch_, done - first_step, spec_.batch_size(), seconds);
  if (spec_.eval()) {  // reported once evaluated: a failure here evaluates it again after the recovery
    CONVEYOR_RETURN_IF_ERROR(Evaluate());
    e.set_has_eval(true);
    e.set_eval_accuracy(status_.eval_accuracy());
  }
  LOG_INFO("job ", status_.job_id(), " epoch ", e.epoch(), ": mean loss ", e.mean_loss(), ", ", seconds, " s",
           e.has_eval() ? ", test accuracy " + std::to_string(e.eval_accuracy()) : "");
  *status_.add_epochs() = std::move(e);
  Publish();
  return absl::OkStatus();
}

Status JobRunner::Evaluate() {
  const int64_t eb = spec_.eval_batch_size();
  const int64_t batches = (test_samples_ + eb - 1) / eb;
  int64_t correct = 0, seen = 0;
  std::vector<v1::RunStepReply> replies;
  for (int64_t b = 0; b < batches; ++b) {
    if (cancelled_) return absl::CancelledError("cancelled");
    v1::RunStepRequest req;
    req.set_job_id(status_.job_id());
    req.set_phase(v1::PHASE_EVAL);
    req.set_step(b);
    req.set_batch_size(std::min(eb, test_samples_ - b * eb));
    CONVEYOR_RETURN_IF_ERROR(StepAll(req, &replies));
    correct += replies.back().correct();
    seen += replies.back().samples();
  }
  status_.set_has_eval(true);
  status_.set_eval_accuracy(seen > 0 ? static_cast<double>(correct) / static_cast<double>(seen) : 0);
  LOG_INFO("job ", status_.job_id(), " test accuracy ", status_.eval_accuracy(), " (", correct, "/", seen, ")");
  return absl::OkStatus();
}

Status JobRunner::SaveWeights() {
  if (spec_.save_path().empty()) return absl::OkStatus();
  std::vector<v1::ParametersReply> parts;
  v1::JobRef ref = Ref();
  for (std::size_t s = 0; s < stages_.size(); ++s) {
    auto reply = stages_[s]->GetParameters(ref, kControlDeadlineS);
    if (!reply.ok()) return ForStage(reply.status(), static_cast<int64_t>(s));
    parts.push_back(std::move(*reply));
  }
  CONVEYOR_RETURN_IF_ERROR(Annotate(WriteWireStateDict(spec_.save_path(), parts), "save.path"));
  Event("trained weights saved to " + spec_.save_path());
  LOG_INFO("job ", status_.job_id(), ": weights saved to ", spec_.save_path());
  return absl::OkStatus();
}

Status JobRunner::CollectDigest() {
  std::map<int, std::string> by_layer;  // model order, whatever stage holds a layer
  v1::JobRef ref = Ref();
  for (std::size_t s = 0; s < stages_.size(); ++s) {
    auto reply = stages_[s]->GetDigest(ref, kControlDeadlineS);
    if (!reply.ok()) return ForStage(reply.status(), s);
    if (reply->layers_size() != reply->layer_digests_size())
      return absl::InternalError("stage " + std::to_string(s) + ": digests without layer indices");
    for (int i = 0; i < reply->layers_size(); ++i) by_layer[reply->layers(i)] = reply->layer_digests(i);
  }
  std::vector<std::string> digests;
  for (auto& [layer, d] : by_layer) digests.push_back(std::move(d));
  status_.set_param_digest(CombineDigests(digests));
  return absl::OkStatus();
}

bool JobRunner::Recoverable(const Status& failure) {
  if (spec_.recovery_timeout_s() <= 0) return false;
  // A stage or link that broke, or a wait that timed out (a cut cable, a
  // stalled peer).
  switch (failure.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kCancelled:
      return true;
    default:
      break;
  }
  // Any other error is the job's own and would happen again, unless a stage
  // is gone or came back without the job (then its error says little).
  for (StageClient* s : stages_) {
    auto info = s->GetInfo(std::min(5.0, spec_.stage_timeout_s()));
    if (!info.ok() || info->job_id() != status_.job_id()) return true;
  }
  return false;
}

Status JobRunner::AwaitStages(const Status& failure) {
  // A failure that comes back at the same step each time is no stage dying.
  const int64_t at = status_.step();
  same_step_recoveries_ = at == failed_at_ ? same_step_recoveries_ + 1 : 1;
  failed_at_ = at;
  if (same_step_recoveries_ > kMaxRecoveriesWithoutProgress) {
    return absl::AbortedError("gave up after " + std::to_string(kMaxRecoveriesWithoutProgress) +
                              " recoveries that failed again at step " + std::to_string(at) +
                              "; last failure: " + std::string(failure.message()));
  }
  status_.set_state(v1::JOB_STATE_RECOVERING);
  status_.set_recoveries(status_.recoveries() + 1);
  status_.set_error(std::string(failure.message()));
  LOG_WARN("job ", status_.job_id(), " recovering after step ", status_.step(), ": ", failure.message());
  Event("step " + std::to_string(status_.step()) + " failed (" + std::string(failure.message()) + "): recovering");
  Publish();
  AbortAll("the job is recovering");
  auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(spec_.recovery_timeout_s()));
  for (std::size_t s = 0; s < stages_.size(); ++s) {
    for (;;) {
      if (cancelled_) return absl::CancelledError("cancelled");
      const double left = std::chrono::duration<double>(deadline - Clock::now()).count();
      if (left <= 0) {
        return absl::UnavailableError("stage " + std::to_string(s) + " at " + stages_[s]->address() +
                                      " did not come back within recovery_timeout (" +
                                      std::to_string(static_cast<int>(spec_.recovery_timeout_s())) +
                                      " s); it failed with: " + std::string(failure.message()));
      }
      // Waits for the stage's connection up to a second at a time, so that a
      // cancel is seen.
      auto info = stages_[s]->GetInfo(std::min(1.0, left));
      if (info.ok()) break;
      std::unique_lock<std::mutex> lock(reason_mu_);
      cancel_cv_.wait_for(lock, std::chrono::milliseconds(100), [&] { return cancelled_.load(); });
    }
  }
  Event("every stage answers again");
  // Drop what the survivors hold of the job; Deploy configures it anew.
  v1::JobRef ref = Ref();
  for (StageClient* s : stages_) s->Release(ref, kAbortDeadlineS).IgnoreError();
  return absl::OkStatus();
}

v1::JobStatus JobRunner::Run() {
  status_.set_state(v1::JOB_STATE_RUNNING);
  status_.set_started_unix_ms(NowUnixMs());
  status_.set_schedule(spec_.schedule());
  status_.set_batch_size(spec_.batch_size());
  status_.set_micro_batches(static_cast<int>(MicroBatchSizes(spec_, spec_.batch_size()).size()));
  status_.set_virtual_stages(spec_.virtual_stages());
  status_.set_theoretical_idle_fraction(TheoreticalIdleFraction(spec_));
  Publish();
  LOG_INFO("job ", status_.job_id(), " (", spec_.name(), ") starts on ", spec_.partition().stages(), " stages");
  if (spec_.schedule() == v1::SCHEDULE_ZERO_BUBBLE)
    LOG_WARN("job ", status_.job_id(), ": the zero-bubble schedule is experimental (see docs/schedules.md)");

  // A job that resumes after a coordinator restart recovers from the start.
  started_ = status_.step() > 0 || status_.checkpoint_step() > 0;
  bool assigned = false;
  Status st;
  for (;;) {
    if (!assigned) {
      st = Setup();
      assigned = st.ok();
    }
    if (st.ok()) st = Deploy();
    if (st.ok()) {
      if (status_.state() == v1::JOB_STATE_RECOVERING) {
        Event("recovered: training goes on from step " + std::to_string(status_.step()));
        status_.clear_error();
      }
      status_.set_state(v1::JOB_STATE_RUNNING);
      Publish();
      st = Train();
    }
    // Jobs given in epochs were evaluated after each (the last included).
    if (st.ok() && spec_.eval() && !ByEpochs()) st = Evaluate();
    if (st.ok()) st = CollectDigest();
    if (st.ok()) st = SaveWeights();
    if (st.ok() || cancelled_ || !started_ || !Recoverable(st)) break;
    st = AwaitStages(st);
    if (!st.ok()) break;
  }

  v1::JobRef ref = Ref();
  if (cancelled_) {
    status_.set_state(v1::JOB_STATE_CANCELLED);
    std::lock_guard<std::mutex> lock(reason_mu_);
    status_.set_error(cancel_reason_);
  } else if (!st.ok()) {
    status_.set_state(v1::JOB_STATE_FAILED);
    status_.set_error(std::string(st.message()));
    status_.set_error_code(absl::StatusCodeToString(st.code()));
  } else {
    status_.set_state(v1::JOB_STATE_SUCCEEDED);
  }
  // A finished job's parameters stay on the stages (GetParameters reads them)
  // until the next job; a failed or cancelled one is dropped at once.
  if (status_.state() != v1::JOB_STATE_SUCCEEDED) {
    for (StageClient* s : stages_) s->Release(ref, kAbortDeadlineS).IgnoreError();
  }
  status_.set_eta_seconds(0);
  status_.set_finished_unix_ms(NowUnixMs());
  LOG_INFO("job ", status_.job_id(), " ", JobStateName(status_.state()),
           status_.error().empty() ? "" : ": " + status_.error());
  Publish();
  return status_;
}

}  // namespace conveyor
