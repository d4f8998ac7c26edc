// The coordinator's jobs, in SQLite under --state-dir: spec, state, status
// (progress, losses, results), a history of events, and which stage holds a
// checkpoint of which step. A restarted coordinator finds its jobs there and
// resumes the ones that were running from their last complete checkpoint.
//
// Thread-safe (one connection, serialised by a mutex).
#pragma once

#include <sqlite3.h>

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "conveyor.pb.h"

namespace conveyor {

// Wall-clock milliseconds since the Unix epoch, as jobs are stamped.
int64_t NowUnixMs();

// Appends an event to the latest ones a job's status carries.
void AddStatusEvent(v1::JobStatus* status, const std::string& text);

// Swaps the per-step series of two statuses (losses, lrs, grad_norms,
// loss_scales, step_seconds), which grow with every step; no copy.
void SwapSeries(v1::JobStatus* a, v1::JobStatus* b);
// Sets `status`'s lr, grad_norm and loss_scale to the last of `series`'s
// (where it has them), as a status left without its series carries them.
void KeepLastOfSeries(v1::JobStatus* status, const v1::JobStatus& series);

// A running job's per-step series hold its last steps, not all of them: a job
// of a week would otherwise keep (in memory, in every copy of its status, in
// every checkpoint's record) a number for every step of the week. They end at
// the status's step: the last element of each is the step `step()`'s, the
// first of `losses` the step SeriesFirstStep's. The job's every step stays in
// the job database's curves (GetCurves, `conveyor plot`).
constexpr int kSeriesSteps = 10000;
// Drops the oldest steps of the series once the losses hold more than `keep`
// plus a quarter (so that the drop, a move of the rest, comes once in keep/4
// steps), leaving `keep`.
void BoundSeries(v1::JobStatus* status, int keep = kSeriesSteps);
// The step (from 1) of `status.losses(0)`.
int64_t SeriesFirstStep(const v1::JobStatus& status);
// Drops the series' elements of the steps after `step` (the job goes back to
// the checkpoint of `step`), those of a step that failed halfway too (a norm
// and a learning rate without a loss); the status's step is left as it was.
void TruncateSeries(v1::JobStatus* status, int64_t step);

struct StoredJob {
  v1::JobSpec spec;
  v1::JobStatus status;
};

class JobStore {
 public:
  // Opens (creating if needed) `path`; ":memory:" for a throwaway store.
  static StatusOr<std::unique_ptr<JobStore>> Open(const std::string& path);
  ~JobStore();
  JobStore(const JobStore&) = delete;
  JobStore& operator=(const JobStore&) = delete;

  // Stores a new QUEUED job and returns its id ("job-<n>", never reused).
  StatusOr<std::string> Insert(const v1::JobSpec& spec, const std::string& yaml, v1::JobStatus status);
  // Saves a job's status. Its per-step series are saved only `with_series`
  // (a state change, the end): a running job's status saved once a second
  // would otherwise write every step's figures again each time; Get returns
  // the series last saved (a checkpoint's record saves them too, for the
  // resume from it).
  Status Update(const v1::JobStatus& status, bool with_series = true);
  Status AddEvent(const std::string& job_id, const std::string& event);
  StatusOr<StoredJob> Get(const std::string& job_id);
  // All jobs in submission order, without losses.
  StatusOr<std::vector<v1::JobStatus>> List();
  // How many jobs are in each state, from the state column alone (no status
  // is read: a count at every submission stays cheap with many jobs stored).
  StatusOr<std::map<v1::JobState, int>> CountByState();
  // Timelines of a job's steps (replacing any kept before), and reading them back.
  Status SaveTraces(const std::string& job_id, const std::vector<v1::StepTrace>& traces);
  StatusOr<std::vector<v1::StepTrace>> Traces(const std::string& job_id);
  // Ids of jobs in `state`, in submission order.
  StatusOr<std::vector<std::string>> InState(v1::JobState state);

  // Records the checkpoints `records` (stage index, record) that the stages
  // of a cut of `cut_stages` stages (0: the job's own) wrote and, in the same
  // transaction, the job's status at that step: a resumed job finds its losses
  // up to the checkpoint it resumes from. With `keep` (0: all), each stage's
  // records beyond its newest max(2, keep) are dropped, as the stage drops the
  // files (keep_checkpoints): a week-long job's table stays its size.
  Status RecordCheckpoints(const v1::JobStatus& status,
                           const std::vector<std::pair<int, v1::CheckpointRecord>>& records, int cut_stages = 0,
                           int keep = 0);
  // A step whose checkpoint is complete: recorded for every stage of the
  // cut it was written under (`stages` of them).
  struct CompleteCheckpoint {
    int64_t step = 0;
    int stages = 0;
  };
  // The job file a job was submitted with (its last resume's overrides applied).
  StatusOr<std::string> SpecYaml(const std::string& job_id);
  // Replaces a job's spec and job file (a resume that changes its layout).
  Status UpdateSpec(const std::string& job_id, const v1::JobSpec& spec, const std::string& yaml);
  // Steps with a checkpoint recorded for every stage of the cut it was
  // written under, newest first: only these count. Records from before the
  // store kept each step's cut count as written under `stages` stages.
  StatusOr<std::vector<CompleteCheckpoint>> CompleteCheckpoints(const std::string& job_id, int stages);
  // Forgets the checkpoints of a step (one of them turned out corrupt).
  Status DropCheckpoints(const std::string& job_id, int64_t step);

  // Training curves: per-step rows and evaluations, in one transaction (the
  // runner batches them). A step or evaluation stored before (a step run
  // again after a recovery) is replaced. A job's step rows stay at most
  // 2 x kCurveRows: past that they are thinned, over the whole run alike, to
  // steps 1, 1 + S, 1 + 2S, ... (S a power of two) and the newest step, at
  // most kCurveRows of them; new steps come in whole until the next thinning.
  static constexpr int64_t kCurveRows = 10000;
  Status AddCurves(const std::string& job_id, const std::vector<v1::CurvePoint>& steps,
                   const std::vector<v1::EvalPoint>& evals);
  // Forgets a job's curve rows of steps after `step` (the job goes back to
  // the checkpoint of `step`: those steps run again, or never).
  Status DropCurves(const std::string& job_id, int64_t step);
  // A job's curves of steps after `after_step`, by step.
  StatusOr<v1::Curves> Curves(const std::string& job_id, int64_t after_step = 0);

 private:
  explicit JobStore(sqlite3* db) : db_(db) {}
  Status Exec(const std::string& sql);
  // A column that came after the table: added where missing, NULL in old rows.
  Status AddColumnIfMissing(const std::string& table, const std::string& column, const std::string& type);
  Status UpdateLocked(const v1::JobStatus& status, bool with_series);  // REQUIRES: mu_ held
  Status ThinCurvesLocked(const std::string& job_id);  // REQUIRES: mu_ held
  // Drops `stage`'s records of `job_id` but its newest `keep`.  REQUIRES: mu_ held
  Status PruneCheckpointsLocked(const std::string& job_id, int stage, int keep);

  std::mutex mu_;  // serialises every use of db_
  sqlite3* db_;
};

}  // namespace conveyor
