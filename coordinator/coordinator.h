// The coordinator's logic, free of gRPC: accepts jobs, keeps them in the job
// store, runs one at a time over its stages in submission order, and answers
// questions about them. CoordinatorService is its gRPC adapter.
//
// Thread-safe. Jobs run on a scheduler thread of the coordinator's own.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
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
  std::vector<std::string> stages;  // stage server addresses, in pipeline order
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

  // Asks the running job, if any, for a checkpoint after its step in flight
  // (JobRunner::RequestCheckpoint): what a scheduler's preemption warning
  // (SIGUSR1) does. Returns what happened, for the log.
  std::string CheckpointNow();

  // Idempotent: cancels the running job and stops the scheduler.
  void Shutdown();

 private:
  Coordinator() = default;
  void SchedulerLoop();
  void RunJob(const std::string& job_id);
  void OnStatus(const v1::JobStatus& status);
  // conveyor_jobs{state} from the store, after a job changed state.
  void CountJobs();

  std::unique_ptr<DirLock> state_lock_;  // one coordinator per state folder
  std::unique_ptr<JobStore> store_;
  std::vector<std::string> data_roots_;
  std::vector<std::unique_ptr<StageClient>> clients_;
  Clock* clock_ = &RealClock();

  std::mutex mu_;  // guards everything below
  std::condition_variable cv_;
  bool stop_ = false;
  uint64_t version_ = 0;         // bumped on every change of any job
  std::string running_id_;       // picked by the scheduler, until it ends
  std::string cancel_pending_;   // cancelled before its runner existed
  JobRunner* runner_ = nullptr;  // the running job's, owned by RunJob()
  v1::JobStatus live_;           // the running job's latest status
  std::chrono::steady_clock::time_point last_saved_;  // a rate, not a timeout: real time
  std::thread scheduler_;
};

}  // namespace conveyor
