#include "coordinator/job_runner.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <cmath>
#include <future>
#include <functional>
#include <memory>
#include <set>
#include <utility>

#include "common/files.h"
#include "common/logging.h"
#include "common/sha256.h"
#include "common/wire.h"
#include "coordinator/graph_warmup.h"
#include "coordinator/job_planner.h"
#include "coordinator/job_store.h"
#include "plan/job_spec.h"
#include "plan/lr_schedule.h"
#include "plan/schedule.h"
#include "torch_format/wire_state_dict.h"

namespace conveyor {
namespace {

using SteadyClock = std::chrono::steady_clock;  // measurements only

}  // namespace

JobRunner::JobRunner(v1::JobStatus status, v1::JobSpec spec, std::vector<StageClient*> stages, JobStore* store,
                     StatusSink sink, Clock* clock)
    : status_(std::move(status)),
      spec_(std::move(spec)),
      stages_(std::move(stages)),
      store_(store),
      sink_(std::move(sink)),
      clock_(clock ? clock : &RealClock()),
      pool_(static_cast<int>(std::max<std::size_t>(1, stages_.size()))),
      odd_pool_(static_cast<int>(std::max<std::size_t>(1, stages_.size()))),
      metrics_(spec_, status_.job_id(), store_) {
  for (const v1::StageReport& r : status_.stages()) holders_.push_back(r.address());
}

void JobRunner::Cancel(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(reason_mu_);
    if (cancel_reason_.empty()) cancel_reason_ = reason;
    cancelled_ = true;
  }
  cancel_cv_.notify_all();
  AbortAll(reason);
}

bool JobRunner::RequestCheckpoint() {
  if (spec_.checkpoint_every() == 0) return false;
  checkpoint_requested_ = true;
  return true;
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

v1::JobRef JobRunner::Ref() const {
  v1::JobRef ref;
  ref.set_job_id(status_.job_id());
  return ref;
}

Status JobRunner::Setup() {
  const int p = spec_.partition().stages();
  const int r = Replicas(spec_);
  if (r > 1 && r * p > static_cast<int>(stages_.size())) {
    return absl::InvalidArgumentError("replicas: " + std::to_string(r) + " copies of " + std::to_string(p) +
                                      " stages need " + std::to_string(r * p) + " stage servers, the coordinator has " +
                                      std::to_string(stages_.size()));
  }
  if (p > static_cast<int>(stages_.size())) {
    return absl::FailedPreconditionError("the job needs " + std::to_string(p) + " stages, the coordinator has " +
                                         std::to_string(stages_.size()));
  }
  // Replica k's stage s is the (k * P + s)th server of the list; replica 0
  // is planned (cut, probed) and the others copy its assignments.
  stages_.resize(static_cast<std::size_t>(r * p));
  for (StageClient* s : stages_)
    if (std::find(holders_.begin(), holders_.end(), s->address()) == holders_.end()) holders_.push_back(s->address());
  CONVEYOR_ASSIGN_OR_RETURN(assignments_, PlanJob(status_.job_id(), ReplicaStages(0), &spec_));
  for (int k = 1; k < r; ++k) {
    for (int s = 0; s < p; ++s) {
      v1::StageAssignment a = assignments_[s];
      if (!a.upstream().empty()) a.set_upstream(stages_[k * p + (s + p - 1) % p]->address());
      if (!a.downstream().empty()) a.set_downstream(stages_[k * p + (s + 1) % p]->address());
      a.set_replica(k);
      assignments_.push_back(std::move(a));
    }
  }
  if (r > 1) {
    CONVEYOR_ASSIGN_OR_RETURN(std::vector<v1::StageInfo> infos, InfoAll(stages_, spec_.stage_timeout_s()));
    std::vector<std::string> addresses;
    for (StageClient* stage : stages_) addresses.push_back(stage->address());
    CONVEYOR_ASSIGN_OR_RETURN(std::vector<v1::CollectiveKind> kinds, PlanCollectives(spec_, infos, addresses, p));
    for (std::size_t i = 0; i < assignments_.size(); ++i) {
      assignments_[i].set_num_replicas(r);
      assignments_[i].set_replica_host(HostOf(stages_[i]->address()));
      assignments_[i].set_replica_collectives(kinds[i % static_cast<std::size_t>(p)]);
    }
  }
  return PlanCopies();
}

std::vector<StageClient*> JobRunner::ReplicaStages(int replica) const {
  const std::size_t p = static_cast<std::size_t>(spec_.partition().stages());
  return {stages_.begin() + static_cast<std::ptrdiff_t>(replica * p),
          stages_.begin() + static_cast<std::ptrdiff_t>((replica + 1) * p)};
}

std::string JobRunner::StageName(std::size_t i) const {
  const std::size_t p = static_cast<std::size_t>(spec_.partition().stages());
  return (Replicas(spec_) > 1 ? "replica " + std::to_string(i / p) + " " : std::string()) + "stage " +
         std::to_string(i % p);
}

std::size_t JobRunner::LossStage() const {
  const int p = spec_.partition().stages();
  return static_cast<std::size_t>(StageOfChunk(spec_.schedule(), p * std::max(1, spec_.virtual_stages()) - 1, p));
}

Status JobRunner::OnStage(const Status& st, std::size_t i) const {
  if (Replicas(spec_) == 1) return ForStage(st, static_cast<int64_t>(i));
  return Annotate(st, StageName(i) + " (" + stages_[i]->address() + ")");
}

Status JobRunner::Deploy() {
  CONVEYOR_RETURN_IF_ERROR(ConfigureAll());
  LOG_INFO("job ", status_.job_id(), ": configured and connected ", stages_.size(), " stage server(s)");
  if (steps_per_epoch_ <= 0)
    return absl::InvalidArgumentError(AccumulateSteps(spec_) > 1
                                          ? "batch_size x accumulate_steps is larger than the training split"
                                          : "batch_size is larger than the training split");
  status_.set_total_epochs(spec_.epochs());
  status_.set_total_steps(spec_.steps() > 0 ? spec_.steps() : spec_.epochs() * steps_per_epoch_);
  if (spec_.steps() > 0)
    status_.set_total_epochs(static_cast<int>((spec_.steps() + steps_per_epoch_ - 1) / steps_per_epoch_));
  progress_.InitStages(stages_.size());
  return Restore();
}

Status JobRunner::ConfigureAll() {
  const int n = static_cast<int>(assignments_.size());  // replicas x stages
  const int p = spec_.partition().stages();
  const bool ring = LinksInARing(spec_.schedule(), assignments_.front().num_chunks(), p);
  // Keep what the stages measured so far; the rest is filled in anew.
  std::vector<v1::StageReport> before(status_.stages().begin(), status_.stages().end());
  status_.clear_stages();
  std::vector<std::string> stores(static_cast<std::size_t>(p));  // replica 0's, by stage
  // Greater than any number a coordinator gave the job before, also one
  // before a restart (the system clock's microseconds).
  deployment_ = std::max(deployment_ + 1, UnixMicros());
  for (int s = 0; s < n; ++s) {
    v1::StageAssignment a = assignments_[s];
    a.set_deployment(deployment_);
    if (a.num_replicas() > 1 && a.replica() > 0) a.set_replica_store(stores[s % p]);
    auto reply = stages_[s]->Configure(a, kControlDeadlineS);
    if (!reply.ok()) return OnStage(reply.status(), s);
    if (a.num_replicas() > 1 && a.replica() == 0) {
      stores[s] = HostOf(stages_[s]->address()) + ":" + std::to_string(reply->replica_store_port());
    }
    if (s == 0) {
      // Optimizer steps: each reads accumulate_steps batches.
      steps_per_epoch_ = reply->train_samples() / spec_.batch_size() / AccumulateSteps(spec_);
      test_samples_ = reply->test_samples();
    }
    v1::StageReport* r = status_.add_stages();
    if (s < static_cast<int>(before.size())) *r = before[s];
    r->clear_chunks();
    for (const auto& ca : a.chunks()) r->add_chunks(ca.index());
    r->set_index(s % p);
    r->set_replica(s / p);
    r->set_address(stages_[s]->address());
    r->set_layer_begin(a.chunks(0).layer_begin());
    r->set_layer_end(a.chunks(0).layer_end());
    r->set_device(reply->device());
    r->set_num_parameters(reply->num_parameters());
    r->set_collectives(a.replica_collectives());
  }
  for (int k = 0; k * p < n; ++k) {
    CONVEYOR_ASSIGN_OR_RETURN(std::vector<v1::LinkSetup> links,
                              PlanLinks(status_.job_id(), spec_, ReplicaStages(k), ring));
    for (int s = 0; s < p; ++s) {
      v1::JobRef ref = Ref();
      *ref.mutable_upstream_link() = links[s];
      auto reply = stages_[k * p + s]->Connect(ref, kControlDeadlineS);
      if (!reply.ok()) return OnStage(reply.status(), k * p + s);
      status_.mutable_stages(k * p + s)->set_transport(s + 1 < p || ring ? reply->transport() : v1::LINK_NONE);
    }
  }
  return absl::OkStatus();
}

Status JobRunner::LoadAll(int64_t step, int stages) {
  v1::LoadCheckpointRequest req;
  req.set_job_id(status_.job_id());
  req.set_step(step);
  req.set_stages(stages);
  for (const std::string& a : holders_) req.add_peers(a);
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
  // commit_steps: a replica's state kept at a loss is a checkpoint too.
  if (!store_ || (spec_.checkpoint_every() == 0 && !spec_.commit_steps())) {
    if (status_.step() > 0) Event("no checkpoints: the job starts again from step 0");
    metrics_.Rewind(0);
    TruncateSeries(&status_, 0);  // every series, step_seconds too
    status_.set_step(0);
    return absl::OkStatus();
  }
  CONVEYOR_ASSIGN_OR_RETURN(std::vector<JobStore::CompleteCheckpoint> complete,
                            store_->CompleteCheckpoints(status_.job_id(), spec_.partition().stages()));
  int64_t restored = 0;
  for (const auto& [step, cut] : complete) {
    Status st = LoadAll(step, cut);
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
  TruncateSeries(&status_, restored);  // before the step: the series end at it
  status_.set_step(restored);
  status_.set_checkpoint_step(restored);
  metrics_.Rewind(restored);
  return absl::OkStatus();
}

Status JobRunner::StepAll(const v1::RunStepRequest& req, std::vector<v1::RunStepReply>* replies, WorkerPool* pool) {
  // Evaluation runs on replica 0 alone (the replicas hold the same parameters).
  const std::size_t p = req.phase() == v1::PHASE_EVAL ? static_cast<std::size_t>(spec_.partition().stages())
                                                       : stages_.size();
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
  (pool ? *pool : pool_).RunAll(calls);
  if (first_failure >= 0) return OnStage(results[first_failure], static_cast<std::size_t>(first_failure));
  for (std::size_t s = 0; s < p; ++s)
    if (!results[s].ok()) return OnStage(results[s], s);
  return absl::OkStatus();
}

v1::RunStepRequest JobRunner::TrainRequest(int64_t step, bool* asked_by_signal) {
  const int64_t total = status_.total_steps();
  const int64_t every = spec_.checkpoint_every();
  v1::RunStepRequest req;
  req.set_job_id(status_.job_id());
  req.set_phase(v1::PHASE_TRAIN);
  req.set_step(step);
  req.set_deployment(deployment_);
  req.set_batch_size(spec_.batch_size());
  const bool asked = checkpoint_requested_.exchange(false);
  const bool next = std::exchange(checkpoint_next_, false);
  req.set_checkpoint(every > 0 && ((step + 1) % every == 0 || step + 1 == total || asked || next));
  *asked_by_signal = asked;
  req.set_total_steps(total);
  // Clipping over several stages, or loss scaling: every stage's share of
  // the norm first (under loss scaling a share that is not finite skips
  // the step on every stage).
  // commit_steps: no stage updates before every stage reduced (a replica
  // lost mid-step leaves the others whole).
  req.set_defer_update((spec_.clip_grad_norm() > 0 && stages_.size() > 1) || LossScaling(spec_) ||
                       spec_.commit_steps());
  if (LossScaling(spec_)) req.set_loss_scale(loss_scale_.scale);
  return req;
}

bool JobRunner::NextMayOverlap(const v1::RunStepRequest& req) const {
  const int64_t done = req.step() + 1;
  if (StepsInFlight(spec_) < 2 || done >= status_.total_steps()) return false;
  // The coordinator decides between the two steps: the update (ApplyStep, or
  // the loss scale the next step is sent with), or an evaluation of the
  // weights at the epoch's end.
  if (req.defer_update() || LossScaling(spec_)) return false;
  if (ByEpochs() && spec_.eval() && done % steps_per_epoch_ == 0) return false;
  return true;
}

bool JobRunner::StagesMayRecordGraphs() const {
  if (!CudaGraphsFor(spec_, /*reference=*/false).on) return false;
  for (const v1::StageReport& s : status_.stages()) {
    if (s.device().rfind("cuda", 0) == 0) return true;
  }
  return false;
}

// Two steps in flight: step N+1 is sent as soon as step N is, where nothing
// the coordinator does between them changes N+1 (NextMayOverlap). A stage
// server runs its steps in order, and launches N+1 while its device still
// works on N, so the device does not wait for the host between steps (the
// reply of N, the request of N+1). Each reply still comes when the device has
// finished that step: the figures and the clock are those of finished steps.
Status JobRunner::Train() {
  const int64_t total = status_.total_steps();
  const int64_t batch = spec_.batch_size();
  const int64_t samples = batch * AccumulateSteps(spec_);  // per optimizer step
  const int64_t first = status_.step();  // > 0 when resumed from a checkpoint
  // The loss scale where the run left it: replayed from the steps' norms.
  loss_scale_ = ReplaySeriesLossScale(spec_, status_);
  started_ = true;
  if (progress_.StartRun(first, total, samples, steps_per_epoch_, ByEpochs())) {
    CONVEYOR_RETURN_IF_ERROR(EndEpoch(first, first, 0));
  }
  progress_.StartEpoch(first);
  auto last_publish = SteadyClock::time_point();
  auto previous_end = SteadyClock::time_point();
  struct InFlight {
    v1::RunStepRequest req;
    bool asked = false;  // its checkpoint was asked for (RequestCheckpoint)
    SteadyClock::time_point sent;
    std::vector<v1::RunStepReply> replies;
    std::future<Status> done;  // last: destroyed first, it waits for the calls
  };
  auto send = [&](int64_t step) {
    auto f = std::make_unique<InFlight>();
    f->req = TrainRequest(step, &f->asked);
    f->sent = SteadyClock::now();
    InFlight* raw = f.get();
    WorkerPool* pool = step % 2 == 0 ? &pool_ : &odd_pool_;
    f->done = std::async(std::launch::async, [this, raw, pool] { return StepAll(raw->req, &raw->replies, pool); });
    return f;
  };
  std::unique_ptr<InFlight> next;  // sent before the step in hand ended
  GraphWarmup warmup(StagesMayRecordGraphs(), first);  // one step at a time while graphs are recorded
  for (int64_t step = first; step < total; ++step) {
    if (cancelled_) return absl::CancelledError("cancelled");
    std::unique_ptr<InFlight> now = next ? std::move(next) : send(step);
    const v1::RunStepRequest& req = now->req;
    if (warmup.MayOverlap(step) && NextMayOverlap(req) && !cancelled_) next = send(step + 1);
    // A step sent early starts, for its clock, when the one before it ended.
    const auto step_start = std::max(now->sent, previous_end);
    CONVEYOR_RETURN_IF_ERROR(now->done.get());
    std::vector<v1::RunStepReply>& replies = now->replies;
    CONVEYOR_RETURN_IF_ERROR(Update(req, &replies));
    warmup.StepDone(std::all_of(replies.begin(), replies.end(), [](const v1::RunStepReply& r) { return r.graphed(); }));
    const auto step_end = SteadyClock::now();
    previous_end = step_end;
    progress_.AddStep(step, replies, step_start, step_end);
    JobMetrics::StepFigures figures;  // Update() added the step's norm and learning rate
    figures.seconds = std::chrono::duration<double>(step_end - step_start).count();
    figures.loss = replies[LossStage()].loss_sum();
    figures.lr = status_.lrs(status_.lrs_size() - 1);
    figures.grad_norm = status_.grad_norms(status_.grad_norms_size() - 1);
    figures.samples_per_second = status_.samples_per_second();
    metrics_.Step(step, figures);
    const int64_t done = step + 1;
    if (req.checkpoint()) RecordCheckpoint(done, replies);
    if (req.checkpoint() && done < total && status_.lost_servers_size() > 0 && PlannedServersAnswer()) {
      grow_back_ = true;  // Run() returns to the planned layout from this checkpoint
      return absl::OkStatus();
    }
    if (now->asked)
      Event("checkpoint of step " + std::to_string(done) + " taken on request (the coordinator got SIGUSR1)");
    // Publish at most ten times a second, and the last step.
    if (done == total || SteadyClock::now() - last_publish > std::chrono::milliseconds(100)) {
      last_publish = SteadyClock::now();
      Publish();
    }
    if (done % std::max<int64_t>(1, steps_per_epoch_ / 4) == 0 || done == total) {
      LOG_INFO("job ", status_.job_id(), " step ", done, "/", total, " loss ", status_.loss(), " ",
               static_cast<int64_t>(status_.samples_per_second()), " samples/s");
    }
    if (ByEpochs() && done % steps_per_epoch_ == 0) {
      CONVEYOR_RETURN_IF_ERROR(EndEpoch(progress_.epoch_first_step(), done, progress_.EpochSeconds()));
      progress_.StartEpoch(done);
    }
  }
  return absl::OkStatus();
}

Status JobRunner::Update(const v1::RunStepRequest& req, std::vector<v1::RunStepReply>* replies) {
  const int64_t step = req.step() + 1;  // as progress counts
  const std::size_t p = static_cast<std::size_t>(spec_.partition().stages());
  auto show = [](double v) { return std::isnan(v) ? std::string("nan") : std::isinf(v) ? "inf" : std::to_string(v); };
  // On GPUs without a deferred update the stages launch the optimizer step
  // before they read the figures (RunStepReply.updated_before_read).
  auto outcome = [&](std::size_t i) {
    return std::string((*replies)[i].updated_before_read() ? "found after its update was launched on the GPU"
                                                           : "no update was made");
  };
  for (std::size_t i = LossStage(); i < replies->size(); i += p) {  // each replica's loss stage
    const double loss = (*replies)[i].loss_sum();
    if (!std::isfinite(loss)) {
      return absl::FailedPreconditionError("step " + std::to_string(step) + ": the loss is " + show(loss) + " on " +
                                           StageName(i) +
                                           (LossStage() + 1 == p ? " (the last); " : " (it holds the model's last chunk); ") +
                                           outcome(i));
    }
  }
  // Replica 0's stages hold one copy of every gradient (the replicas' are
  // all-reduced, equal). Gradients flow from the last stage to the first:
  // the highest stage with a gradient that is not finite saw it first.
  double sq = 0;
  const bool scaling = LossScaling(spec_);
  for (std::size_t s = p; s-- > 0;) {
    const double share = (*replies)[s].grad_sq_norm();
    if (!std::isfinite(share) && !scaling) {
      return absl::FailedPreconditionError("step " + std::to_string(step) + ": the gradient norm is " +
                                           show(std::sqrt(share)) + " on " + StageName(s) +
                                           " (the first to see it); " + outcome(s));
    }
    sq += share;
  }
  const double norm = std::sqrt(sq);
  const bool found_inf = !std::isfinite(norm);  // only under loss scaling
  status_.add_grad_norms(norm);
  status_.add_lrs(LearningRate(spec_, req.step(), req.total_steps()));
  if (scaling) {
    status_.add_loss_scales(loss_scale_.scale);
    if (found_inf) {
      Event("step " + std::to_string(step) + ": a gradient is not finite at loss scale " +
            std::to_string(loss_scale_.scale) + ": skipped on every stage");
    }
    UpdateLossScale(spec_, found_inf, &loss_scale_);
    if (!(loss_scale_.scale > 0) || !std::isfinite(loss_scale_.scale)) {
      return absl::FailedPreconditionError("step " + std::to_string(step) + ": the loss scale left the numbers (" +
                                           show(loss_scale_.scale) +
                                           "): the gradients are not finite at any scale; no update was made");
    }
  }
  if (!req.defer_update()) return absl::OkStatus();
  v1::ApplyStepRequest apply;
  apply.set_job_id(status_.job_id());
  apply.set_step(req.step());
  apply.set_deployment(deployment_);
  apply.set_skip(found_inf);
  apply.set_grad_scale(found_inf ? 1.0 : spec_.clip_grad_norm() > 0 ? ClipFactor(spec_.clip_grad_norm(), norm) : 1.0);
  apply.set_checkpoint(req.checkpoint());
  std::vector<StatusOr<v1::ApplyStepReply>> results(stages_.size(), absl::UnknownError("not called"));
  std::vector<std::function<void()>> calls;
  for (std::size_t s = 0; s < stages_.size(); ++s) {
    calls.push_back([&, s] { results[s] = stages_[s]->ApplyStep(apply, kStepDeadlineS); });
  }
  pool_.RunAll(calls);
  for (std::size_t s = 0; s < stages_.size(); ++s) {
    if (!results[s].ok()) return ForStage(results[s].status(), static_cast<int64_t>(s));
    *(*replies)[s].mutable_checkpoint() = results[s]->checkpoint();
  }
  return absl::OkStatus();
}

void JobRunner::RecordCheckpoint(int64_t done, const std::vector<v1::RunStepReply>& replies) {
  // Complete on every stage: from now on a recovery resumes here.
  std::vector<std::pair<int, v1::CheckpointRecord>> records;
  // With replicas only replica 0's stages write one (the copies hold the same state).
  const std::size_t p = static_cast<std::size_t>(spec_.partition().stages());
  for (std::size_t s = 0; s < std::min(p, replies.size()); ++s)
    records.emplace_back(static_cast<int>(s), replies[s].checkpoint());
  status_.set_checkpoint_step(done);
  metrics_.Checkpoint();  // the curves up to here are stored with it
  if (store_) {
    Status st = store_->RecordCheckpoints(status_, records, static_cast<int>(p), spec_.keep_checkpoints());
    if (!st.ok()) LOG_ERROR("job ", status_.job_id(), ": recording the checkpoint of step ", done, ": ", st.message());
  }
  LOG_DEBUG("job ", status_.job_id(), ": checkpoint of step ", done, " complete on every stage");
}

Status JobRunner::EndEpoch(int64_t first_step, int64_t done, double seconds) {
  v1::EpochReport e =
      EpochOfSeries(status_, steps_per_epoch_, done - first_step, spec_.batch_size() * AccumulateSteps(spec_), seconds);
  if (spec_.eval()) {  // reported once evaluated: a failure here evaluates it again after the recovery
    CONVEYOR_RETURN_IF_ERROR(Evaluate());
    e.set_has_eval(true);
    e.set_eval_accuracy(status_.eval_accuracy());
    e.set_eval_loss(status_.eval_loss());
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
  double loss_weighted = 0;  // each batch's mean loss times its samples
  int64_t samples = 0;
  std::vector<v1::RunStepReply> replies;
  for (int64_t b = 0; b < batches; ++b) {
    if (cancelled_) return absl::CancelledError("cancelled");
    v1::RunStepRequest req;
    req.set_job_id(status_.job_id());
    req.set_phase(v1::PHASE_EVAL);
    req.set_step(b);
    req.set_deployment(deployment_);
    req.set_batch_size(std::min(eb, test_samples_ - b * eb));
    CONVEYOR_RETURN_IF_ERROR(StepAll(req, &replies));
    const std::size_t p = static_cast<std::size_t>(spec_.partition().stages());
    const v1::RunStepReply& last = replies[replies.size() - p + LossStage()];  // the last replica's
    correct += last.correct();
    seen += last.samples();
    loss_weighted += last.loss_sum() * static_cast<double>(req.batch_size());
    samples += req.batch_size();
  }
  status_.set_has_eval(true);
  status_.set_eval_loss(samples > 0 ? loss_weighted / static_cast<double>(samples) : 0);
  status_.set_eval_accuracy(seen > 0 ? static_cast<double>(correct) / static_cast<double>(seen) : 0);
  metrics_.Eval(status_.step(), status_.eval_loss(), status_.eval_accuracy());
  LOG_INFO("job ", status_.job_id(), " test accuracy ", status_.eval_accuracy(), " (", correct, "/", seen, ")");
  return absl::OkStatus();
}

Status JobRunner::SaveWeights() {
  if (spec_.save_path().empty()) return absl::OkStatus();
  // Folders missing under the path are made, as `conveyor export` does.
  const std::filesystem::path folder = std::filesystem::path(spec_.save_path()).parent_path();
  std::error_code made;
  if (!folder.empty()) std::filesystem::create_directories(folder, made);
  if (made) {
    return absl::FailedPreconditionError("save.path: cannot make the folder " + folder.string() + ": " +
                                         made.message());
  }
  std::vector<v1::ParametersReply> parts;
  const std::vector<StageClient*> stages = ReplicaStages(0);  // the replicas hold the same parameters
  for (std::size_t s = 0; s < stages.size(); ++s) {
    auto reply = GatherParameters(status_.job_id(), [&](const v1::JobRef& ref) {
      return stages[s]->GetParameters(ref, kControlDeadlineS);
    });
    if (!reply.ok()) return ForStage(reply.status(), static_cast<int64_t>(s));
    parts.push_back(std::move(*reply));
  }
  if (spec_.save_format() == v1::SAVE_FORMAT_TORCHSCRIPT) {
    // The first stage holds the archive and LibTorch; it builds the file's
    // bytes, this process writes them (docs/jobs.md, save).
    v1::TorchScriptRequest req;
    req.set_job_id(status_.job_id());
    for (auto& part : parts) *req.add_parts() = std::move(part);
    auto archive = stages_[0]->ExportTorchScript(req, kControlDeadlineS);
    if (!archive.ok()) return ForStage(archive.status(), 0);
    CONVEYOR_RETURN_IF_ERROR(Annotate(WriteFileAtomically(spec_.save_path(), archive->archive()), "save.path"));
  } else {
    CONVEYOR_RETURN_IF_ERROR(Annotate(WriteWireStateDict(spec_.save_path(), parts), "save.path"));
  }
  Event("trained weights saved to " + spec_.save_path());
  LOG_INFO("job ", status_.job_id(), ": weights saved to ", spec_.save_path());
  return absl::OkStatus();
}

Status JobRunner::CollectDigest() {
  std::map<int, std::string> by_layer;  // model order, whatever stage holds a layer
  v1::JobRef ref = Ref();
  for (std::size_t s = 0; s < stages_.size(); ++s) {
    auto reply = stages_[s]->GetDigest(ref, kControlDeadlineS);
    if (!reply.ok()) return OnStage(reply.status(), s);
    if (reply->layers_size() != reply->layer_digests_size())
      return OnStage(absl::InternalError("digests without layer indices"), s);
    for (int i = 0; i < reply->layers_size(); ++i) {
      // Replicas after replica 0 must hold what it holds, bit for bit.
      auto [it, added] = by_layer.emplace(reply->layers(i), reply->layer_digests(i));
      if (!added && it->second != reply->layer_digests(i))
        return OnStage(absl::InternalError("layer " + std::to_string(reply->layers(i)) +
                                           " differs from replica 0's copy after training"), s);
    }
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

Status JobRunner::AwaitStages(const Status& failure, std::vector<std::size_t>* lost) {
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
  metrics_.Recovery();
  status_.set_error(std::string(failure.message()));
  LOG_WARN("job ", status_.job_id(), " recovering after step ", status_.step(), ": ", failure.message());
  Event("step " + std::to_string(status_.step()) + " failed (" + std::string(failure.message()) + "): recovering");
  Publish();
  AbortAll("the job is recovering");
  const std::string no_replan = ReplansOnLostServer(spec_) ? WhyNoReplan() : "on_lost_server: fail";
  const Clock::TimePoint deadline = clock_->After(no_replan.empty() ? LostAfterS(spec_) : spec_.recovery_timeout_s());
  for (std::size_t s = 0; s < stages_.size(); ++s) {
    for (;;) {
      if (cancelled_) return absl::CancelledError("cancelled");
      const double left = std::chrono::duration<double>(deadline - clock_->Now()).count();
      // Waits for the stage's connection up to a second at a time, so that a
      // cancel is seen (gRPC decides that second, in real time); asked once
      // at least, also with lost_after 0.
      auto info = stages_[s]->GetInfo(std::clamp(left, 0.25, 1.0));
      if (info.ok()) break;
      if (clock_->Now() >= deadline) {
        if (no_replan.empty()) {
          lost->push_back(s);
          break;
        }
        return absl::UnavailableError(StageName(s) + " at " + stages_[s]->address() +
                                      " did not come back within recovery_timeout (" +
                                      std::to_string(static_cast<int>(spec_.recovery_timeout_s())) +
                                      " s); it failed with: " + std::string(failure.message()) +
                                      " (the job could not go on without it: " + no_replan + ")");
      }
      std::unique_lock<std::mutex> lock(reason_mu_);
      clock_->WaitUntil(cancel_cv_, lock, clock_->After(0.1), [&] { return cancelled_.load(); });
    }
  }
  if (lost->size() == stages_.size()) {
    return absl::UnavailableError("every stage server of the job was lost (none answered within lost_after, " +
                                  std::to_string(static_cast<int>(LostAfterS(spec_))) +
                                  " s); the last failure: " + std::string(failure.message()));
  }
  if (lost->empty()) Event("every stage answers again");
  LOG_INFO("job ", status_.job_id(), ": ", stages_.size() - lost->size(), " stage server(s) answer, ", lost->size(),
           " lost; releasing them");
  // Drop what the survivors hold of the job (the lost servers are left
  // behind); Deploy configures it anew. All at once: a survivor may still
  // wait in its replicas' all-reduce for a copy whose step was aborted, and
  // is freed when that copy's Release drops its group (its connections
  // close). One at a time, a survivor asked first held its Release until its
  // deadline (5 s after a replica-1 server died). With commit_steps the
  // replicas that lost a server go first, which frees the others the same
  // way; then the first whole replica writes its state (KeepReplicaState)
  // before it is released too.
  const bool keep = spec_.commit_steps() && !lost->empty() && Replicas(spec_) > 1;
  const std::size_t p = static_cast<std::size_t>(spec_.partition().stages());
  std::set<std::size_t> hit;
  for (std::size_t s : *lost) hit.insert(s / p);
  ReleaseSurvivors(*lost, [&](std::size_t s) { return !keep || hit.count(s / p); });
  if (keep) {
    KeepReplicaState(hit);
    ReleaseSurvivors(*lost, [&](std::size_t s) { return !hit.count(s / p); });
  }
  LOG_INFO("job ", status_.job_id(), ": released the stage servers left");
  return absl::OkStatus();
}

void JobRunner::ReleaseSurvivors(const std::vector<std::size_t>& lost, const std::function<bool(std::size_t)>& which) {
  v1::JobRef ref = Ref();
  std::vector<std::function<void()>> releases;
  for (std::size_t s = 0; s < stages_.size(); ++s) {
    if (std::find(lost.begin(), lost.end(), s) != lost.end() || !which(s)) continue;
    StageClient* c = stages_[s];
    releases.push_back([c, &ref] { c->Release(ref, kAbortDeadlineS).IgnoreError(); });
  }
  pool_.RunAll(releases);
}

v1::JobStatus JobRunner::Run() {
  AnnounceStart();
  // A job that resumes after a coordinator restart recovers from the start.
  started_ = status_.step() > 0 || status_.checkpoint_step() > 0;
  bool assigned = false;
  bool weights_kept = false;  // trained, but the save failed: the stages keep the job
  Status st;
  for (;;) {
    if (!assigned) {
      st = Setup();
      assigned = st.ok();
      if (assigned && planned_stages_.empty()) {
        planned_stages_ = stages_;
        planned_spec_ = spec_;
      }
    }
    if (st.ok()) st = Deploy();
    // The stages' parameter counts are known now: a save.path without room
    // for them fails the job before its first step, not after its last.
    if (st.ok() && !started_) st = CheckSaveRoom(spec_, status_);
    if (st.ok()) {
      if (status_.state() == v1::JOB_STATE_RECOVERING) {
        Event("recovered: training goes on from step " + std::to_string(status_.step()));
        status_.clear_error();
      }
      status_.set_state(v1::JOB_STATE_RUNNING);
      Publish();
      st = Train();
      if (st.ok() && grow_back_) {
        grow_back_ = false;
        GrowBack();
        assigned = false;  // planned anew over the planned servers
        continue;
      }
    }
    if (st.ok()) st = FinishTrained(&weights_kept);
    if (weights_kept) break;
    if (st.ok() || cancelled_ || !started_ || !Recoverable(st)) break;
    st = RecoverFrom(st, &assigned);
    if (!st.ok()) break;
  }
  EndJob(st, weights_kept);
  return status_;
}

void JobRunner::AnnounceStart() {
  status_.set_state(v1::JOB_STATE_RUNNING);
  status_.set_started_unix_ms(NowUnixMs());
  status_.set_schedule(spec_.schedule());
  status_.set_batch_size(spec_.batch_size());
  status_.set_tokens(TokensPerSample(spec_) > 0);
  status_.set_micro_batches(static_cast<int>(MicroBatchCount(spec_, spec_.batch_size())));
  status_.set_virtual_stages(spec_.virtual_stages());
  status_.set_theoretical_idle_fraction(TheoreticalIdleFraction(spec_));
  Publish();
  LOG_INFO("job ", status_.job_id(), " (", spec_.name(), ") starts on ", spec_.partition().stages(), " stages",
           Replicas(spec_) > 1 ? " x " + std::to_string(Replicas(spec_)) + " replicas" : "");
}

Status JobRunner::FinishTrained(bool* weights_kept) {
  // Jobs given in epochs were evaluated after each (the last included).
  if (spec_.eval() && !ByEpochs()) CONVEYOR_RETURN_IF_ERROR(Evaluate());
  CONVEYOR_RETURN_IF_ERROR(CollectDigest());
  // Trained: a failure to write the file fails the job, but the weights
  // stay on the stages for `conveyor export` (no recovery trains again).
  Status st = SaveWeights();
  if (st.ok()) return st;
  *weights_kept = true;
  return Status(st.code(), std::string(st.message()) +
                               "; the job trained to its end and its weights stay on the stage servers until "
                               "their next job: `conveyor export " + status_.job_id() + " --out FILE` writes them");
}

Status JobRunner::RecoverFrom(const Status& failure, bool* assigned) {
  std::vector<std::size_t> lost;
  CONVEYOR_RETURN_IF_ERROR(AwaitStages(failure, &lost));
  if (!lost.empty()) {
    CONVEYOR_RETURN_IF_ERROR(Replan(lost));
    *assigned = false;  // planned anew over the servers left
  }
  return absl::OkStatus();
}

void JobRunner::EndJob(const Status& st, bool weights_kept) {
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
  if (status_.state() != v1::JOB_STATE_SUCCEEDED && !weights_kept) {
    for (StageClient* s : stages_) s->Release(ref, kAbortDeadlineS).IgnoreError();
  }
  metrics_.Flush(/*now=*/true);
  status_.set_eta_seconds(0);
  status_.set_finished_unix_ms(NowUnixMs());
  LOG_INFO("job ", status_.job_id(), " ", JobStateName(status_.state()),
           status_.error().empty() ? "" : ": " + status_.error());
  Publish();
}

}  // namespace conveyor
