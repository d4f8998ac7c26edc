#include "coordinator/coordinator.h"


#include "common/files.h"
#include "plan/job_overrides.h"
#include "plan/job_spec.h"
#include "plan/placement.h"
#include "common/logging.h"
#include "coordinator/job_metrics.h"
#include "coordinator/job_planner.h"

#include <algorithm>

namespace conveyor {
namespace {
// Why the running job stops when the coordinator does; it is not cancelled
// for good: it stays running in the job store and resumes on the next start.
constexpr char kShutdownReason[] = "the coordinator shut down";
}  // namespace

StatusOr<std::unique_ptr<Coordinator>> Coordinator::Start(CoordinatorOptions options) {
  if (options.stages.empty()) return absl::InvalidArgumentError("the coordinator needs at least one stage address");
  std::unique_ptr<Coordinator> c(new Coordinator());
  std::string db = ":memory:";
  if (!options.state_dir.empty()) {
    CONVEYOR_ASSIGN_OR_RETURN(c->state_lock_, DirLock::Acquire(options.state_dir, "state folder"));
    db = options.state_dir + "/conveyor.db";
  }
  CONVEYOR_ASSIGN_OR_RETURN(c->store_, JobStore::Open(db));
  c->data_roots_ = options.data_roots;
  if (options.clock) c->clock_ = options.clock;
  if (!options.client_factory) options.client_factory = MakeGrpcStageClient;
  for (const auto& address : options.stages) c->clients_.push_back(options.client_factory(address));
  c->server_job_.assign(c->clients_.size(), "");

  // Jobs that were running when an earlier coordinator stopped go first in
  // the queue again and resume from their last complete checkpoint.
  for (v1::JobState state : {v1::JOB_STATE_RUNNING, v1::JOB_STATE_RECOVERING}) {
    CONVEYOR_ASSIGN_OR_RETURN(auto orphans, c->store_->InState(state));
    for (const auto& id : orphans) {
      CONVEYOR_ASSIGN_OR_RETURN(StoredJob job, c->store_->Get(id));
      const std::string what = "the coordinator restarted while the job ran: it resumes from the checkpoint of step " +
                               std::to_string(job.status.checkpoint_step());
      job.status.set_state(v1::JOB_STATE_QUEUED);
      AddStatusEvent(&job.status, what);
      CONVEYOR_RETURN_IF_ERROR(c->store_->Update(job.status));
      c->store_->AddEvent(id, what).IgnoreError();
      LOG_WARN("job ", id, ": ", what);
    }
  }
  c->CountJobs();
  if (!options.defer_scheduling) c->StartScheduling();
  return c;
}

void Coordinator::StartScheduling() {
  std::lock_guard<std::mutex> lock(mu_);
  if (scheduler_.joinable() || stop_) return;
  scheduler_ = std::thread([this] { SchedulerLoop(); });
}

Coordinator::~Coordinator() { Shutdown(); }

void Coordinator::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return;
    stop_ = true;
    for (auto& [id, job] : running_)
      if (job.runner) job.runner->Cancel(kShutdownReason);  // one without a runner yet is cancelled by RunJob
  }
  cv_.notify_all();
  if (scheduler_.joinable()) scheduler_.join();
  std::vector<std::thread> threads;
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return running_.empty(); });
    threads.swap(finished_);
  }
  for (auto& t : threads) t.join();
}

StatusOr<std::string> Coordinator::Submit(const std::string& job_yaml) {
  CONVEYOR_ASSIGN_OR_RETURN(v1::JobSpec spec, ParseJobYaml(job_yaml));
  CONVEYOR_RETURN_IF_ERROR(ResolveJobPaths(&spec, data_roots_));
  CONVEYOR_RETURN_IF_ERROR(CheckSavePath(spec.save_path()));  // this process writes it
  if (Replicas(spec) > 1 && Replicas(spec) * spec.partition().stages() > static_cast<int>(clients_.size())) {
    return absl::InvalidArgumentError("replicas: " + std::to_string(Replicas(spec)) + " copies of " +
                                      std::to_string(spec.partition().stages()) + " stages need " +
                                      std::to_string(Replicas(spec) * spec.partition().stages()) +
                                      " stage servers, this coordinator has " + std::to_string(clients_.size()));
  }
  if (spec.partition().stages() > static_cast<int>(clients_.size())) {
    return absl::FailedPreconditionError("the job needs " + std::to_string(spec.partition().stages()) +
                                         " stages, this coordinator has " + std::to_string(clients_.size()));
  }
  std::lock_guard<std::mutex> submitting(submit_mu_);
  CONVEYOR_RETURN_IF_ERROR(CheckSavePathFree(spec, ""));
  CONVEYOR_ASSIGN_OR_RETURN(std::string id, store_->Insert(spec, job_yaml, v1::JobStatus()));
  store_->AddEvent(id, "submitted").IgnoreError();
  LOG_INFO("job ", id, " (", spec.name(), ") queued");
  CountJobs();
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++version_;
  }
  cv_.notify_all();
  return id;
}

Status Coordinator::CheckSavePathFree(const v1::JobSpec& spec, const std::string& job_id) {
  if (spec.save_path().empty()) return absl::OkStatus();
  // The running jobs' states as they are now (the store lags their end).
  CONVEYOR_ASSIGN_OR_RETURN(std::vector<v1::JobStatus> jobs, List(/*with_losses=*/false));
  for (const v1::JobStatus& other : jobs) {
    if (IsTerminal(other.state()) || other.job_id() == job_id) continue;
    auto stored = store_->Get(other.job_id());
    if (stored.ok() && stored->spec.save_path() == spec.save_path()) {
      return absl::FailedPreconditionError("save.path: " + other.job_id() + " (" + JobStateName(other.state()) +
                                           ") writes " + spec.save_path() +
                                           " too; give this job another path, or wait for that one to end");
    }
  }
  return absl::OkStatus();
}

StatusOr<v1::JobStatus> Coordinator::Resume(const std::string& job_id, const std::vector<std::string>& sets) {
  std::lock_guard<std::mutex> submitting(submit_mu_);
  CONVEYOR_ASSIGN_OR_RETURN(v1::JobStatus now, Get(job_id, true));  // NOT_FOUND for an unknown job
  if (now.state() != v1::JOB_STATE_FAILED && now.state() != v1::JOB_STATE_CANCELLED) {
    return absl::FailedPreconditionError("job " + job_id + " is " + JobStateName(now.state()) +
                                         ": only a failed or cancelled job resumes");
  }
  CONVEYOR_ASSIGN_OR_RETURN(StoredJob job, store_->Get(job_id));
  {
    // Its runner may still be writing its end (the store has it already).
    std::lock_guard<std::mutex> lock(mu_);
    if (running_.count(job_id))
      return absl::FailedPreconditionError("job " + job_id + " is still stopping; resume it once it has");
  }
  std::string relaid;
  if (!sets.empty()) {
    CONVEYOR_ASSIGN_OR_RETURN(std::string yaml, store_->SpecYaml(job_id));
    CONVEYOR_ASSIGN_OR_RETURN(yaml, ApplyJobOverrides(yaml, sets));
    CONVEYOR_ASSIGN_OR_RETURN(v1::JobSpec spec, ParseJobYaml(yaml));
    CONVEYOR_RETURN_IF_ERROR(ResolveJobPaths(&spec, data_roots_));
    std::string said;
    for (const std::string& s : sets) said += (said.empty() ? "" : ", ") + s;
    if (TrainingDigest(spec) != TrainingDigest(job.spec)) {
      return absl::InvalidArgumentError(
          "resume --set " + said + " changes how job " + job_id +
          " trains, not only how it is laid out: a resume may change the partition, replicas, zero, schedule, "
          "recomputation, transports and the checkpoint and recovery keys; submit a new job for the rest");
    }
    if (Replicas(spec) > 1 && spec.partition().SerializeAsString() != job.spec.partition().SerializeAsString()) {
      // A replica group loads the files of the cut it runs (each stage's, or its copy).
      return absl::InvalidArgumentError("resume --set " + said +
                                        ": a job with replicas resumes on its own partition; change the "
                                        "partition as one pipeline (replicas=1)");
    }
    const int need = std::max(1, Replicas(spec)) * spec.partition().stages();
    if (need > static_cast<int>(clients_.size())) {
      return absl::FailedPreconditionError("resume --set " + said + ": the job would need " + std::to_string(need) +
                                           " stage servers, this coordinator has " + std::to_string(clients_.size()));
    }
    CONVEYOR_RETURN_IF_ERROR(store_->UpdateSpec(job_id, spec, yaml));
    relaid = " with " + said + " (its checkpoint is loaded resharded)";
  }
  CONVEYOR_RETURN_IF_ERROR(CheckSavePathFree(job.spec, job_id));
  const std::string what =
      std::string(job.status.state() == v1::JOB_STATE_FAILED ? "resumed after it failed" : "resumed after it was cancelled") +
      (job.status.error().empty() ? std::string() : " (" + job.status.error() + ")") + relaid +
      (job.status.checkpoint_step() > 0
           ? ": it goes on from the checkpoint of step " + std::to_string(job.status.checkpoint_step())
           : ": it has no checkpoint and starts again from step 0");
  job.status.set_state(v1::JOB_STATE_QUEUED);
  job.status.clear_error();
  job.status.clear_error_code();
  job.status.clear_finished_unix_ms();
  AddStatusEvent(&job.status, what);
  CONVEYOR_RETURN_IF_ERROR(store_->Update(job.status));
  store_->AddEvent(job_id, what).IgnoreError();
  LOG_INFO("job ", job_id, ": ", what);
  CountJobs();
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++version_;
  }
  cv_.notify_all();
  return job.status;
}

namespace {

// Leaves the series of `*status` out (GetJobRequest.omit_losses), keeping
// their last figures.
void OmitSeries(v1::JobStatus* status) {
  KeepLastOfSeries(status, *status);
  v1::JobStatus none;
  SwapSeries(status, &none);
}

// A copy of `live` without its series, keeping their last figures, made
// without copying the series (they are swapped out and back: `live` ends as
// it was).
v1::JobStatus CopyWithoutSeries(v1::JobStatus& live) {
  v1::JobStatus series;
  SwapSeries(&live, &series);
  v1::JobStatus copy = live;
  KeepLastOfSeries(&copy, series);
  SwapSeries(&live, &series);  // back
  return copy;
}

// A job cancelled by this coordinator's shutdown (SIGTERM: a pod
// rescheduled, a Slurm job requeued) is not the user's cancel: it stays
// running, and the next coordinator with this state resumes it from its last
// complete checkpoint.
void KeepRunningAcrossShutdown(bool stopping, v1::JobStatus* status) {
  if (!stopping || status->state() != v1::JOB_STATE_CANCELLED || status->error() != kShutdownReason) return;
  status->set_state(v1::JOB_STATE_RUNNING);
  status->clear_error();
  status->clear_finished_unix_ms();
  AddStatusEvent(status, "the coordinator stopped; the job resumes when it starts again");
}

}  // namespace

StatusOr<v1::JobStatus> Coordinator::Get(const std::string& job_id, bool omit_losses) {
  v1::JobStatus status;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = running_.find(job_id);
    // Copied without the series, which grow with every step.
    if (it != running_.end() && omit_losses) return CopyWithoutSeries(it->second.live);
    if (it != running_.end()) status = it->second.live;
  }
  if (status.job_id().empty()) {
    auto job = store_->Get(job_id);
    if (!job.ok()) return job.status();
    status = std::move(job->status);
  }
  if (omit_losses) OmitSeries(&status);
  return status;
}

StatusOr<std::vector<v1::JobStatus>> Coordinator::List(bool with_losses) {
  CONVEYOR_ASSIGN_OR_RETURN(auto jobs, store_->List());
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& j : jobs) {
    auto it = running_.find(j.job_id());
    if (it != running_.end() && !it->second.live.job_id().empty()) {
      j = it->second.live;
    } else if (with_losses && j.step() > 0) {
      // The store's list leaves losses out.
      auto full = store_->Get(j.job_id());
      if (full.ok()) *j.mutable_losses() = full->status.losses();
    }
    if (!with_losses) OmitSeries(&j);
  }
  return jobs;
}

std::vector<v1::StageHealth> Coordinator::ListStages(double timeout_s) {
  std::vector<v1::StageHealth> out;
  std::vector<std::string> placed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    placed = server_job_;
  }
  for (std::size_t i = 0; i < clients_.size(); ++i) {
    const auto& client = clients_[i];
    v1::StageHealth h;
    h.set_address(client->address());
    h.set_running_job(placed[i]);
    auto info = client->Ping(timeout_s);
    h.set_reachable(info.ok());
    if (info.ok()) {
      h.set_device(info->device());
      h.set_job_id(info->job_id());
    } else {
      // The client's message starts with the address, which h already has.
      std::string why(info.status().message());
      if (why.rfind(h.address() + " ", 0) == 0) why = why.substr(h.address().size() + 1);
      h.set_error(why);
    }
    out.push_back(std::move(h));
  }
  return out;
}

StatusOr<v1::JobStatus> Coordinator::Cancel(const std::string& job_id) {
  CONVEYOR_ASSIGN_OR_RETURN(v1::JobStatus status, Get(job_id, true));
  if (IsTerminal(status.state()))
    return absl::FailedPreconditionError("job " + job_id + " already " + JobStateName(status.state()));
  std::unique_lock<std::mutex> lock(mu_);
  auto it = running_.find(job_id);
  if (it != running_.end()) {
    if (it->second.runner) {
      it->second.runner->Cancel("cancelled by the user");
    } else {
      it->second.cancel_pending = true;  // RunJob cancels it as soon as its runner exists
    }
    return status;
  }
  // Still queued (the scheduler reads the state from the store under mu_).
  status.set_state(v1::JOB_STATE_CANCELLED);
  status.set_error("cancelled by the user before it started");
  CONVEYOR_RETURN_IF_ERROR(store_->Update(status));
  store_->AddEvent(job_id, "cancelled").IgnoreError();
  CountJobs();
  ++version_;
  cv_.notify_all();
  return status;
}

std::string Coordinator::CheckpointNow() {
  std::lock_guard<std::mutex> lock(mu_);
  std::string said;
  for (auto& [id, job] : running_) {
    if (!job.runner) continue;
    if (!said.empty()) said += "; ";
    if (!job.runner->RequestCheckpoint()) {
      said += "job " + id + " has checkpoint_every: 0 and takes no checkpoints: it would start again from step 0";
    } else {
      said += "job " + id + " checkpoints after its step in flight";
    }
  }
  return said.empty() ? "no job is running: nothing to checkpoint" : said;
}

StatusOr<v1::StepTrace> Coordinator::GetTrace(const std::string& job_id, int64_t step) {
  CONVEYOR_RETURN_IF_ERROR(Get(job_id, true).status());  // NOT_FOUND for an unknown job
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = running_.find(job_id);
    if (it != running_.end() && it->second.runner) return it->second.runner->Trace(step);
  }
  CONVEYOR_ASSIGN_OR_RETURN(auto traces, store_->Traces(job_id));
  return FindTrace(traces, step);
}

StatusOr<v1::Curves> Coordinator::GetCurves(const std::string& job_id, int64_t after_step) {
  CONVEYOR_ASSIGN_OR_RETURN(StoredJob job, store_->Get(job_id));  // NOT_FOUND for an unknown job
  CONVEYOR_ASSIGN_OR_RETURN(v1::Curves curves, store_->Curves(job_id, after_step));
  curves.set_tokens(TokensPerSample(job.spec) > 0);
  return curves;
}

void Coordinator::CountJobs() {
  auto counts = store_->CountByState();
  if (counts.ok()) PublishJobCounts(*counts);
}

StatusOr<v1::JobStatus> Coordinator::Watch(const std::string& job_id, uint64_t* version,
                                           std::chrono::steady_clock::time_point deadline, bool omit_losses) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    clock_->WaitUntil(cv_, lock, deadline, [&] { return stop_ || version_ != *version; });
    *version = version_;
    // The watch ends here, not with whatever the jobs look like while they
    // stop: a watcher waits for the next coordinator (the job goes on there).
    if (stop_) return absl::UnavailableError("the coordinator is shutting down");
  }
  return Get(job_id, omit_losses);
}

void Coordinator::OnStatus(const v1::JobStatus& reported) {
  bool save = false, state_changed = false;
  v1::JobStatus unseries;  // what a save between state changes writes: the series are not
  v1::JobStatus status = reported;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = running_.find(status.job_id());
    if (it == running_.end()) return;
    Running& job = it->second;
    // Watchers and the store never see a job end by this coordinator's
    // shutdown: it goes on under the next one.
    KeepRunningAcrossShutdown(stop_, &status);
    state_changed = status.state() != job.live.state();
    job.live = status;
    ++version_;
    auto now = std::chrono::steady_clock::now();
    if (state_changed || now - job.last_saved > std::chrono::seconds(1)) {
      job.last_saved = now;
      save = true;
      if (!state_changed) unseries = CopyWithoutSeries(job.live);
    }
  }
  cv_.notify_all();
  if (save) {  // the series (every step's figures) at a state change; checkpoints' records save them too
    Status st = store_->Update(state_changed ? status : unseries, /*with_series=*/state_changed);
    if (!st.ok()) LOG_ERROR("saving job ", status.job_id(), ": ", st.message());
    if (state_changed) CountJobs();
  }
}

void Coordinator::RunJob(const std::string& job_id, std::vector<int> servers) {
  // Frees the job's servers and lets the scheduler place the next (and
  // Shutdown join this thread).
  auto done = [&] {
    std::lock_guard<std::mutex> lock(mu_);
    for (int i : servers) server_job_[static_cast<std::size_t>(i)].clear();
    auto it = running_.find(job_id);
    if (it != running_.end()) {
      finished_.push_back(std::move(it->second.thread));
      running_.erase(it);
    }
    ++version_;
    cv_.notify_all();
  };
  auto job = store_->Get(job_id);
  if (!job.ok()) {
    LOG_ERROR("cannot load job ", job_id, ": ", job.status().message());
    done();
    return;
  }
  std::vector<StageClient*> stages;
  for (int i : servers) {
    StageClient* c = clients_[static_cast<std::size_t>(i)].get();
    c->Reconnect();  // names resolved now: a restarted pod is found where it is
    stages.push_back(c);
  }
  JobRunner runner(job->status, job->spec, stages, store_.get(), [this](const v1::JobStatus& s) { OnStatus(s); },
                   clock_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    Running& r = running_[job_id];
    r.runner = &runner;
    r.live = job->status;
    if (stop_) runner.Cancel(kShutdownReason);
    if (r.cancel_pending) runner.Cancel("cancelled by the user");
  }
  std::string where;
  for (StageClient* c : stages) where += (where.empty() ? "" : ", ") + c->address();
  store_->AddEvent(job_id, "started on " + where).IgnoreError();
  v1::JobStatus final_status = runner.Run();
  bool stopping = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping = stop_;
    running_[job_id].runner = nullptr;
  }
  KeepRunningAcrossShutdown(stopping, &final_status);
  Status st = store_->SaveTraces(job_id, runner.Traces());
  if (!st.ok()) LOG_ERROR("saving the timelines of job ", job_id, ": ", st.message());
  st = store_->Update(final_status);
  if (!st.ok()) LOG_ERROR("saving job ", job_id, ": ", st.message());
  store_->AddEvent(job_id, JobStateName(final_status.state()) + (final_status.error().empty() ? "" : ": " + final_status.error()))
      .IgnoreError();
  CountJobs();
  done();
}

std::optional<std::vector<int>> Coordinator::Place(const StoredJob& job) const {
  const int p = job.spec.partition().stages(), r = Replicas(job.spec);
  const int need = p * r;
  // A job that ran before (a coordinator restart) goes back to its servers:
  // their folders hold its checkpoints.
  if (job.status.stages_size() == need) {
    std::vector<int> before;
    for (const auto& st : job.status.stages()) {
      for (std::size_t i = 0; i < clients_.size(); ++i)
        if (clients_[i]->address() == st.address()) before.push_back(static_cast<int>(i));
    }
    if (static_cast<int>(before.size()) == need) {
      for (int i : before)
        if (!server_job_[static_cast<std::size_t>(i)].empty()) return std::nullopt;
      return before;
    }
  }
  // Free servers by host, hosts in the pool's order; each replica on one
  // host where one has P free, else from the hosts in order.
  std::vector<std::pair<std::string, std::vector<int>>> hosts;
  int free = 0;
  for (std::size_t i = 0; i < clients_.size(); ++i) {
    if (!server_job_[i].empty()) continue;
    const std::string host = HostOf(clients_[i]->address());
    auto it = std::find_if(hosts.begin(), hosts.end(), [&](const auto& h) { return h.first == host; });
    if (it == hosts.end()) it = hosts.insert(hosts.end(), {host, {}});
    it->second.push_back(static_cast<int>(i));
    ++free;
  }
  if (free < need) return std::nullopt;
  std::vector<int> placed;
  for (int k = 0; k < r; ++k) {
    auto it = std::find_if(hosts.begin(), hosts.end(), [&](const auto& h) { return static_cast<int>(h.second.size()) >= p; });
    for (int s = 0; s < p; ++s) {
      if (it == hosts.end() || it->second.empty())
        it = std::find_if(hosts.begin(), hosts.end(), [](const auto& h) { return !h.second.empty(); });
      placed.push_back(it->second.front());
      it->second.erase(it->second.begin());
    }
  }
  return placed;
}

void Coordinator::SchedulerLoop() {
  // Say at once which stages do not answer: under an orchestrator they may
  // still be starting, and a job that needs one fails when it is placed.
  for (const auto& h : ListStages()) {
    if (!h.reachable())
      LOG_WARN("stage server ", h.address(), " ", h.error(), ": a job placed on it fails with UNAVAILABLE until it serves");
  }
  std::unique_lock<std::mutex> lock(mu_);
  uint64_t seen = version_ - 1;  // look at the store at least once
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || seen != version_; });
    if (stop_) return;
    seen = version_;
    std::vector<std::thread> ended;
    ended.swap(finished_);
    for (auto& t : ended) t.join();  // they only return from RunJob's last lines
    auto queued = store_->InState(v1::JOB_STATE_QUEUED);
    if (!queued.ok()) {
      LOG_ERROR("job database: ", queued.status().message());
      continue;
    }
    // In submission order, each job that fits in the free servers; the first
    // that does not waits, and the ones behind it with it.
    for (const std::string& id : *queued) {
      if (running_.count(id)) continue;
      auto job = store_->Get(id);
      if (!job.ok()) {
        LOG_ERROR("cannot load job ", id, ": ", job.status().message());
        continue;
      }
      std::optional<std::vector<int>> servers = Place(*job);
      if (!servers) break;
      Running& r = running_[id];  // from here Cancel() treats it as running
      for (int i : *servers) server_job_[static_cast<std::size_t>(i)] = id;
      r.thread = std::thread([this, id, servers = *servers] { RunJob(id, servers); });
    }
  }
}

}  // namespace conveyor
