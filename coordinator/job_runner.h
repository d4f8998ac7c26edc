// Drives one job over its stages: assigns the partition, opens the links,
// starts every step on all stages at once, evaluates, collects the digest.
//
// The coordinator starts steps; it never drives micro-batches nor relays
// tensors. Any stage's failure aborts the step on every stage (so none waits
// for a neighbour that will not send). A stage that died or became unreachable
// puts the job in RECOVERING: the runner waits (up to recovery_timeout) for
// every stage to answer again, configures them anew, reloads the last
// checkpoint complete on all of them and goes on from there. A stage server
// that does not answer within lost_after is lost for good: the runner
// re-plans the job onto the servers left (on_lost_server: replan), each now
// holding whole stages of the old cut, and they load the newest complete
// checkpoint resharded, from the copies the servers keep of each other's
// files. Any other failure fails the job with that stage's message.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/worker_pool.h"
#include "conveyor.pb.h"
#include "common/clock.h"
#include "coordinator/job_metrics.h"
#include "coordinator/job_store.h"
#include "coordinator/progress.h"
#include "coordinator/stage_client.h"
#include "plan/lr_schedule.h"

namespace conveyor {

class JobRunner {
 public:
  // Receives a snapshot whenever the job's status changes. Called on the
  // thread that runs Run().
  using StatusSink = std::function<void(const v1::JobStatus&)>;

  // `status` holds the job's id, name and submission time, and for a job that
  // resumes its progress so far; `stages` are not owned, at least as many as
  // the spec's partition has stages; `store` (not owned) keeps checkpoint
  // records and events; `clock` (not owned; RealClock() when null) decides
  // how long a recovery waits for the stages.
  JobRunner(v1::JobStatus status, v1::JobSpec spec, std::vector<StageClient*> stages, JobStore* store,
            StatusSink sink, Clock* clock = nullptr);
  JobRunner(const JobRunner&) = delete;
  JobRunner& operator=(const JobRunner&) = delete;

  // Runs the job to its end; returns the final status (SUCCEEDED, FAILED or
  // CANCELLED). Call once.
  v1::JobStatus Run();

  // Stops the job at the next chance, from any thread; it ends CANCELLED.
  void Cancel(const std::string& reason);

  // Asks for a checkpoint after the training step in flight (or the next one),
  // from any thread: a scheduler's warning before preemption (SIGUSR1 to the
  // coordinator). False, and nothing asked, when the job takes no checkpoints
  // (checkpoint_every: 0).
  bool RequestCheckpoint();

  // Timelines kept so far: the first Progress::kFirstTraces steps and the
  // last Progress::kLastTraces. Thread-safe. step -1: the last one kept.
  StatusOr<v1::StepTrace> Trace(int64_t step) const { return progress_.Trace(step); }
  std::vector<v1::StepTrace> Traces() const { return progress_.Traces(); }

  // Recoveries in a row that fail again at the same step before the job
  // fails instead.
  static constexpr int kMaxRecoveriesWithoutProgress = 3;

 private:
  // Checks the stages, balances the partition and learns every chunk's shapes
  // (once per job: job_planner.h).
  Status Setup();
  // With save.path: every stage's parameters and buffers, written by the
  // coordinator as one state_dict, or (save.format torchscript) as the
  // archive that the first stage builds with them.
  Status SaveWeights();
  // Configures and connects every stage, then restores the newest checkpoint
  // complete on all of them (each time the job starts or recovers).
  Status Deploy();
  // Configure + Connect on every stage: the job's initial parameters.
  Status ConfigureAll();
  Status Restore();
  // Loads the checkpoint of `step`, written under a cut of `stages` stages,
  // on every stage at once.
  Status LoadAll(int64_t step, int stages);
  // Whether `failure` is a stage that died or a link that broke (then the job
  // recovers) rather than an error that would happen again.
  bool Recoverable(const Status& failure);
  // RECOVERING: waits for every stage to answer within recovery_timeout, by
  // clock_. Where the job goes on without lost servers (WhyNoReplan), a
  // server that does not answer within lost_after is put in `lost` (indices
  // into stages_) instead of failing the job.
  Status AwaitStages(const Status& failure, std::vector<std::size_t>* lost);
  // Why a lost server fails this job rather than being re-planned around
  // ("" when it can be).
  std::string WhyNoReplan() const;
  // The job folded onto the servers left without `lost`: the cut merged
  // (plan/placement.h MergeStages), stages_ without them; Setup plans it anew.
  Status Replan(const std::vector<std::size_t>& lost);
  // Replan for a job with replicas: the replicas that lost a server are
  // dropped, the others take the whole global batch between them.
  Status DropReplica(const std::vector<std::size_t>& lost);
  // Releases the servers left (not in `lost`) for which `which` holds.
  void ReleaseSurvivors(const std::vector<std::size_t>& lost, const std::function<bool(std::size_t)>& which);
  // commit_steps: the first replica not in `hit` writes its state (whole
  // after the job's last committed step) as a checkpoint, recorded as the
  // newest complete one, so that the job goes on from it; where a stage
  // cannot, the job goes back to the checkpoint before, as without.
  void KeepReplicaState(const std::set<std::size_t>& hit);
  // After a re-plan: whether every server of the job's planned layout
  // answers again, free (a lost one came back, or was started anew at its
  // address); asked after each checkpoint.
  bool PlannedServersAnswer();
  // Back to the planned layout: its servers and cut; Setup plans it anew and
  // the checkpoint just taken is loaded resharded.
  void GrowBack();
  // Each replica-0 stage's checkpoint_copy_to: the next server of the job
  // with a --checkpoint-dir (checkpoint_copies).
  Status PlanCopies();
  void Event(const std::string& text);
  v1::JobRef Ref() const;  // this job's id, as stage calls take it
  Status Train();
  // Run, in its order: the job's status RUNNING and its figures published;
  // after training, the evaluation, the digest and the saved weights (a save
  // that fails sets `weights_kept`: the stages keep the job); a recovery
  // from `failure` (re-planned without the servers lost, `assigned` then
  // cleared); the job's final state, its stages released unless it
  // succeeded or kept its weights.
  void AnnounceStart();
  Status FinishTrained(bool* weights_kept);
  Status RecoverFrom(const Status& failure, bool* assigned);
  void EndJob(const Status& st, bool weights_kept);
  // After training step `done`: the checkpoint just taken is complete on
  // every stage.
  void RecordCheckpoint(int64_t done, const std::vector<v1::RunStepReply>& replies);
  // Reports the epoch that step `done` ended (`seconds` long), evaluating
  // after it with eval.
  Status EndEpoch(int64_t first_step, int64_t done, double seconds);
  Status Evaluate();
  // Whether the job trains for epochs (not a number of steps).
  bool ByEpochs() const { return spec_.steps() == 0 && steps_per_epoch_ > 0; }
  Status CollectDigest();
  // Runs `req` on every stage at once (evaluation: on replica 0's); replies
  // in the order of stages_. `pool` makes the calls (pool_ when null); two
  // steps in flight use two pools.
  Status StepAll(const v1::RunStepRequest& req, std::vector<v1::RunStepReply>* replies, WorkerPool* pool = nullptr);
  // Training step `step`'s request; whether its checkpoint was asked for
  // (RequestCheckpoint) in `asked_by_signal`.
  v1::RunStepRequest TrainRequest(int64_t step, bool* asked_by_signal);
  // Whether training step `req` may still be running on the stages when the
  // next one is sent (see Train()).
  bool NextMayOverlap(const v1::RunStepRequest& req) const;
  // Whether some stage may record CUDA graphs in this job (cuda_graphs on,
  // and a stage on a CUDA device).
  bool StagesMayRecordGraphs() const;
  // After StepAll of training step `req`: fails the job on a loss or gradient
  // norm that is not finite (FAILED_PRECONDITION naming the step and the stage
  // that saw it first), records the step's lr and global gradient norm, and
  // for a deferred update (clip_grad_norm over several stages) has every stage
  // apply it, scaled by the one clipping factor (ApplyStep).
  Status Update(const v1::RunStepRequest& req, std::vector<v1::RunStepReply>* replies);
  // replicas: replica `replica`'s P stages, in stage order.
  std::vector<StageClient*> ReplicaStages(int replica) const;
  // "stage s", or with replicas "replica k stage s", of stages_[i].
  std::string StageName(std::size_t i) const;
  // The stage that holds the model's last chunk, whose replies carry the
  // loss (the last stage; the first under zbv's V).
  std::size_t LossStage() const;
  // `st` named by the stage (and replica) of stages_[i].
  Status OnStage(const Status& st, std::size_t i) const;
  void AbortAll(const std::string& reason);
  void Publish();

  v1::JobStatus status_;
  v1::JobSpec spec_;  // the partition's boundaries are filled in by Setup()
  std::vector<StageClient*> stages_;  // replicas x stages: replica k's stage s at k * P + s
  JobStore* store_;
  StatusSink sink_;
  Clock* clock_;
  WorkerPool pool_;
  WorkerPool odd_pool_;  // the calls of odd training steps (pool_: even ones and everything else)
  std::atomic<bool> cancelled_{false};
  std::atomic<bool> checkpoint_requested_{false};
  // A checkpoint at the next step, unasked: the state a replica kept at a
  // loss (KeepReplicaState) then has a copy on another server.
  bool checkpoint_next_ = false;
  std::mutex reason_mu_;  // guards cancel_reason_
  std::condition_variable cancel_cv_;  // with reason_mu_: wakes waits when cancelled
  std::string cancel_reason_;

  std::vector<v1::StageAssignment> assignments_;  // by Setup(), per stage
  // Every server that held a stage of the job (now or before a re-plan or a
  // resume), less the lost ones: where a stage may find the checkpoint files
  // of another cut, or their copies.
  std::vector<std::string> holders_;
  // The layout the job was first planned with (by the first Setup): its
  // servers, cut and per-stage keys, to return to once lost servers answer.
  std::vector<StageClient*> planned_stages_;
  v1::JobSpec planned_spec_;
  bool grow_back_ = false;  // Train() stopped at a checkpoint to return to it
  bool started_ = false;  // training began (now or before a coordinator restart)
  int64_t failed_at_ = -1;  // steps done at the last recovery
  int64_t deployment_ = 0;  // the job's configuration (StageAssignment.deployment)
  int same_step_recoveries_ = 0;
  int64_t steps_per_epoch_ = 0;
  int64_t test_samples_ = 0;
  Progress progress_{&status_};  // status fields, epochs and traces of the steps
  JobMetrics metrics_;           // Prometheus series and the curves in the store
  LossScaleState loss_scale_;    // loss scaling: the next step's scale (replayed on resume)
};

}  // namespace conveyor
