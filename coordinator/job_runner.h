// Drives one job over its stages: assigns the partition, opens the links,
// starts every step on all stages at once, evaluates, collects the digest.
//
// The coordinator starts steps; it never drives micro-batches nor relays
// tensors. Any stage's failure aborts the step on every stage (so none waits
// for a neighbour that will not send) and fails the job with that stage's
// message.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/worker_pool.h"
#include "conveyor.pb.h"
#include "coordinator/stage_client.h"

namespace conveyor {

class JobRunner {
 public:
  // Receives a snapshot whenever the job's status changes. Called on the
  // thread that runs Run().
  using StatusSink = std::function<void(const v1::JobStatus&)>;

  // `status` holds the job's id, name and submission time; `stages` are not
  // owned, at least as many as the spec's partition has stages.
  JobRunner(v1::JobStatus status, v1::JobSpec spec, std::vector<StageClient*> stages, StatusSink sink);
  JobRunner(const JobRunner&) = delete;
  JobRunner& operator=(const JobRunner&) = delete;

  // Runs the job to its end; returns the final status (SUCCEEDED, FAILED or
  // CANCELLED). Call once.
  v1::JobStatus Run();

  // Stops the job at the next chance, from any thread; it ends CANCELLED.
  void Cancel(const std::string& reason);

  // Timelines kept so far: the first kFirstTraces steps and the last
  // kLastTraces. Thread-safe. step -1: the last one kept.
  static constexpr int kFirstTraces = 3;
  static constexpr int kLastTraces = 10;
  StatusOr<v1::StepTrace> Trace(int64_t step) const;
  std::vector<v1::StepTrace> Traces() const;

 private:
  Status Setup();
  // partition.balance params or time: profiles the model on stage 0 and sets
  // the boundaries that make the costliest chunk as cheap as possible.
  Status BalancePartition();
  // Decides each link's transport from spec.transport and the stages (CUDA
  // device, NCCL built in) and has the upstream end of every NCCL link make
  // its ids. Returns, per stage, the setup of the link from its upstream
  // neighbour. FAILED_PRECONDITION naming the link for transport: nccl on a
  // link that cannot use it.
  StatusOr<std::vector<v1::LinkSetup>> PlanLinks(bool ring);
  Status Train();
  Status Evaluate();
  Status CollectDigest();
  // Runs `req` on every stage at once; replies in stage order.
  Status StepAll(const v1::RunStepRequest& req, std::vector<v1::RunStepReply>* replies);
  void AbortAll(const std::string& reason);
  void Publish();
  void KeepTrace(int64_t step, const std::vector<v1::RunStepReply>& replies);

  v1::JobStatus status_;
  v1::JobSpec spec_;  // the partition's boundaries are filled in by Setup()
  std::vector<StageClient*> stages_;
  StatusSink sink_;
  WorkerPool pool_;
  std::atomic<bool> cancelled_{false};
  std::mutex reason_mu_;  // guards cancel_reason_
  std::string cancel_reason_;

  int64_t steps_per_epoch_ = 0;
  int64_t test_samples_ = 0;
  std::vector<double> busy_, wall_;  // per stage, summed over steps

  mutable std::mutex trace_mu_;  // guards traces_
  std::map<int64_t, v1::StepTrace> traces_;
};

// Finds a step's trace among `traces`; NOT_FOUND names the steps kept.
StatusOr<v1::StepTrace> FindTrace(const std::vector<v1::StepTrace>& traces, int64_t step);

}  // namespace conveyor
