// coordinator/: the coordinator process, the one place that knows every job.
// It accepts jobs, keeps them (job_store.h, SQLite), plans each onto stage
// servers (job_planner.h), drives its steps, evaluations and recoveries
// (job_runner.h) and reports progress; it never touches a tensor, so it links
// no LibTorch.
//
// This class is the coordinator's logic, free of gRPC: accepts jobs, keeps
// them in the job store, places them on its pool of stage servers and runs
// them, and answers questions about them. CoordinatorService is its gRPC
// adapter.
//
// The pool: each job takes replicas x stages servers of its own for as long
// as it runs (a recovery waits for those same servers). Jobs start in
// submission order as soon as enough servers are free, so jobs that fit side
// by side run at once; a job that does not fit yet waits, and so do the jobs
// behind it (first come, first served: a large job is never overtaken for
// good). A job resumed after a coordinator restart goes back to the servers
// that hold its checkpoints.
//
// Thread-safe. A scheduler thread of the coordinator's own places jobs;
// each running job has a thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/files.h"
#include "common/status.h"
#include "conveyor.pb.h"
#include "common/clock.h"
#include "coordinator/job_runner.h"
#include "coordinator/job_store.h"
#include "coordinator/stage_client.h"

namespace conveyor {

struct CoordinatorOptions {
  // The pool of stage server addresses; a job's pipeline takes free ones in
  // this order (grouped by host, so that a replica's neighbouring stages share
  // a host where they can).
  std::vector<std::string> stages;
  std::string state_dir;            // holds conveyor.db; "" keeps jobs in memory only
  // The only folders whose files a job may name (ResolveJobPaths in
  // common/job_spec.h): relative paths are relative to the first; none: no
  // confinement, relative to the working folder.
  std::vector<std::string> data_roots;
  // Start() leaves jobs queued until StartScheduling(): the program first
  // binds its port, so that a coordinator that cannot serve runs no job.
  bool defer_scheduling = false;
  // Makes the client of one stage; gRPC unless a test substitutes its own.
  std::function<std::unique_ptr<StageClient>(const std::string& address)> client_factory;
  // Decides Watch deadlines and how long a recovery waits for its stages;
  // not owned, outlives the coordinator. RealClock() when null; tests pass a
  // FakeClock.
  Clock* clock = nullptr;
};

class Coordinator {
 public:
  static StatusOr<std::unique_ptr<Coordinator>> Start(CoordinatorOptions options);
  ~Coordinator();
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  // INVALID_ARGUMENT for a bad job file, NOT_FOUND for a file it names that
  // is not on this host, FAILED_PRECONDITION when the job needs more stages
  // than the coordinator has.
  StatusOr<std::string> Submit(const std::string& job_yaml);
  // NOT_FOUND for an unknown id.
  StatusOr<v1::JobStatus> Get(const std::string& job_id, bool omit_losses = false);
  StatusOr<std::vector<v1::JobStatus>> List(bool with_losses = false);
  // Asks every stage server now whether it answers (a refused connection
  // fails at once; one that never answers within `timeout_s`).
  std::vector<v1::StageHealth> ListStages(double timeout_s = 2.0);
  // Queued jobs end at once, a running one at its next step; FAILED_PRECONDITION
  // for a job that already ended.
  StatusOr<v1::JobStatus> Cancel(const std::string& job_id);
  // Queues a failed or cancelled job again, to go on from its last
  // checkpoint complete on every stage (from step 0 without one).
  // FAILED_PRECONDITION for a job in any other state, or whose save.path a
  // queued or running job writes; NOT_FOUND for an unknown id.
  // `sets`: job-key overrides (as `--set` takes them) that change only how
  // the job is laid out (its TrainingDigest, plan/placement.h, stays): its
  // checkpoint is then loaded resharded. INVALID_ARGUMENT for one that
  // changes its training.
  StatusOr<v1::JobStatus> Resume(const std::string& job_id, const std::vector<std::string>& sets = {});
  // Waits until anything changed since `*version` (then updates it) or until
  // `deadline` by clock(), and returns the job's status.
  StatusOr<v1::JobStatus> Watch(const std::string& job_id, uint64_t* version,
                                std::chrono::steady_clock::time_point deadline, bool omit_losses);

  // The timeline of one step (-1: the last kept). NOT_FOUND names the steps
  // that have one.
  StatusOr<v1::StepTrace> GetTrace(const std::string& job_id, int64_t step);

  // A job's training curves after step `after_step` (a running job's are at
  // most about a second behind). NOT_FOUND for an unknown id.
  StatusOr<v1::Curves> GetCurves(const std::string& job_id, int64_t after_step = 0);

  // The clock that deadlines given to Watch are on.
  Clock& clock() const { return *clock_; }

  // Starts running queued jobs (Start() does unless defer_scheduling).
  // Idempotent.
  void StartScheduling();

  // Asks every running job for a checkpoint after its step in flight
  // (JobRunner::RequestCheckpoint): what a scheduler's preemption warning
  // (SIGUSR1) does. Returns what happened, for the log.
  std::string CheckpointNow();

  // Idempotent: cancels the running job and stops the scheduler.
  void Shutdown();

 private:
  // A job placed on its servers, from the moment the scheduler picks it.
  struct Running {
    JobRunner* runner = nullptr;  // owned by RunJob(), while it runs
    bool cancel_pending = false;  // cancelled before its runner existed
    v1::JobStatus live;           // its latest status
    std::chrono::steady_clock::time_point last_saved;  // a rate, not a timeout: real time
    std::thread thread;
  };

  Coordinator() = default;
  void SchedulerLoop();
  // The servers for `job` among the free ones (mu_ held), or nothing yet.
  std::optional<std::vector<int>> Place(const StoredJob& job) const;
  // Runs job_id on `servers` (indices into clients_: replica k's stage s at
  // k * P + s), then frees them.
  void RunJob(const std::string& job_id, std::vector<int> servers);
  void OnStatus(const v1::JobStatus& status);
  // FAILED_PRECONDITION when a queued or running job other than `job_id`
  // writes `spec`'s save.path (two jobs would overwrite each other's
  // weights). REQUIRES: submit_mu_ held.
  Status CheckSavePathFree(const v1::JobSpec& spec, const std::string& job_id);
  // conveyor_jobs{state} from the store, after a job changed state.
  void CountJobs();

  std::unique_ptr<DirLock> state_lock_;  // one coordinator per state folder
  std::unique_ptr<JobStore> store_;
  std::vector<std::string> data_roots_;
  std::vector<std::unique_ptr<StageClient>> clients_;
  Clock* clock_ = &RealClock();

  std::mutex submit_mu_;  // one Submit at a time: its save.path check and its insert

  std::mutex mu_;  // guards everything below
  std::condition_variable cv_;
  bool stop_ = false;
  uint64_t version_ = 0;                    // bumped on every change of any job
  std::map<std::string, Running> running_;  // by job id
  std::vector<std::string> server_job_;     // by server: the job placed on it, "" when free
  std::vector<std::thread> finished_;       // threads of jobs that ended, to join
  std::thread scheduler_;
};

}  // namespace conveyor
