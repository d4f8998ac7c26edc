#include "coordinator/job_store.h"

#include <gtest/gtest.h>
#include <sqlite3.h>

#include "tests/support/test_util.h"

namespace conveyor {
namespace {

v1::CurvePoint Point(int64_t step, double loss, bool grad_norm) {
  v1::CurvePoint p;
  p.set_step(step);
  p.set_loss(loss);
  p.set_lr(0.01 * static_cast<double>(step));
  p.set_has_grad_norm(grad_norm);
  p.set_grad_norm(grad_norm ? 2.5 : 0);
  p.set_step_seconds(0.125);
  p.set_samples_per_second(256);
  p.set_tokens_per_second(0);
  p.set_unix_ms(1000 + step);
  return p;
}

// A week-long job's curves stay a bounded number of rows, thinned alike over
// the whole run; the newest step is always there.
TEST(JobStore, ALongJobsCurvesAreThinnedEvenlyToABoundedNumberOfRows) {
  const testing::ScopedTempDir folder("job-store");
  auto store = JobStore::Open(folder.path() + "/curves.db");
  ASSERT_TRUE(store.ok()) << store.status();
  constexpr int64_t kSteps = 50000, kBatch = 1000;
  const int64_t most = 2 * JobStore::kCurveRows;
  for (int64_t first = 1; first <= kSteps; first += kBatch) {
    std::vector<v1::CurvePoint> batch;
    for (int64_t step = first; step < first + kBatch; ++step) batch.push_back(Point(step, 1.0, false));
    ASSERT_TRUE((*store)->AddCurves("job-1", batch, {}).ok());
    auto curves = (*store)->Curves("job-1");
    ASSERT_TRUE(curves.ok()) << curves.status();
    ASSERT_LE(curves->steps_size(), most) << "after step " << first + kBatch - 1;
    ASSERT_EQ(curves->steps(curves->steps_size() - 1).step(), first + kBatch - 1);
  }
  ASSERT_TRUE((*store)->AddCurves("job-2", {Point(1, 7, false)}, {}).ok());
  auto curves = (*store)->Curves("job-1");
  ASSERT_TRUE(curves.ok());
  const int n = curves->steps_size();
  ASSERT_GT(n, JobStore::kCurveRows / 2);
  EXPECT_EQ(curves->steps(0).step(), 1);
  EXPECT_EQ(curves->steps(n - 1).step(), kSteps);
  // Before the steps since the last thinning (whole), every S-th step from
  // step 1 (S a power of two), and the newest step of that thinning.
  const int64_t stride = curves->steps(1).step() - 1;
  EXPECT_GT(stride, 1);
  EXPECT_EQ(stride & (stride - 1), 0) << stride;
  int tail = n - 1;
  while (tail > 0 && curves->steps(tail).step() - curves->steps(tail - 1).step() == 1) --tail;
  EXPECT_GT(n - tail, 1) << "no whole steps after the last thinning";
  int unaligned = 0;
  int64_t previous = 1 - stride;
  for (int i = 0; i < tail; ++i) {
    const int64_t step = curves->steps(i).step();
    if ((step - 1) % stride != 0) {
      ++unaligned;
      continue;
    }
    EXPECT_EQ(step, previous + stride) << "a thinned step is missing";
    previous = step;
  }
  EXPECT_LE(unaligned, 1);
  // Another job's rows are its own; a recovery still drops later rows.
  EXPECT_EQ((*store)->Curves("job-2")->steps_size(), 1);
  ASSERT_TRUE((*store)->DropCurves("job-1", 1000).ok());
  auto dropped = (*store)->Curves("job-1");
  ASSERT_TRUE(dropped.ok());
  EXPECT_LE(dropped->steps(dropped->steps_size() - 1).step(), 1000);
}

TEST(JobStore, KeepsCurvesAcrossReopening) {
  const testing::ScopedTempDir folder("job-store");
  const std::string path = folder.path() + "/curves.db";
  v1::EvalPoint eval;
  eval.set_step(2);
  eval.set_loss(0.75);
  eval.set_accuracy(0.5);
  eval.set_unix_ms(5000);
  {
    auto store = JobStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    // Two batches, as the runner writes them; step 2 is run again after a
    // recovery and replaces the first row; another job's rows stay apart.
    ASSERT_TRUE((*store)->AddCurves("job-1", {Point(1, 1.5, false), Point(2, 9, false)}, {}).ok());
    ASSERT_TRUE((*store)->AddCurves("job-1", {Point(2, 1.25, true), Point(3, 1.0, false)}, {eval}).ok());
    ASSERT_TRUE((*store)->AddCurves("job-2", {Point(1, 7, false)}, {}).ok());
    ASSERT_TRUE((*store)->AddCurves("job-2", {}, {}).ok());
  }
  auto store = JobStore::Open(path);
  ASSERT_TRUE(store.ok());
  auto curves = (*store)->Curves("job-1");
  ASSERT_TRUE(curves.ok()) << curves.status();
  EXPECT_EQ(curves->job_id(), "job-1");
  ASSERT_EQ(curves->steps_size(), 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(curves->steps(i).step(), i + 1);
  EXPECT_EQ(curves->steps(1).SerializeAsString(), Point(2, 1.25, true).SerializeAsString());
  EXPECT_EQ(curves->steps(0).SerializeAsString(), Point(1, 1.5, false).SerializeAsString());
  EXPECT_FALSE(curves->steps(2).has_grad_norm());
  ASSERT_EQ(curves->evals_size(), 1);
  EXPECT_EQ(curves->evals(0).SerializeAsString(), eval.SerializeAsString());

  auto later = (*store)->Curves("job-1", 2);
  ASSERT_TRUE(later.ok());
  ASSERT_EQ(later->steps_size(), 1);
  EXPECT_EQ(later->steps(0).step(), 3);
  EXPECT_EQ(later->evals_size(), 0);
  auto other = (*store)->Curves("job-2");
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->steps_size(), 1);
  auto none = (*store)->Curves("job-3");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->steps_size(), 0);

  // Back to the checkpoint of step 1: later steps and evaluations go, other jobs' stay.
  ASSERT_TRUE((*store)->DropCurves("job-1", 1).ok());
  auto dropped = (*store)->Curves("job-1");
  ASSERT_TRUE(dropped.ok());
  ASSERT_EQ(dropped->steps_size(), 1);
  EXPECT_EQ(dropped->steps(0).step(), 1);
  EXPECT_EQ(dropped->evals_size(), 0);
  EXPECT_EQ((*store)->Curves("job-2")->steps_size(), 1);
}

TEST(JobStore, KeepsJobsAcrossReopening) {
  const testing::ScopedTempDir folder("job-store");
  const std::string path = folder.path() + "/jobs.db";
  v1::JobSpec spec;
  spec.set_name("first");
  std::string a, b;
  {
    auto store = JobStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    auto id = (*store)->Insert(spec, "name: first", v1::JobStatus());
    ASSERT_TRUE(id.ok()) << id.status();
    a = *id;
    spec.set_name("second");
    id = (*store)->Insert(spec, "name: second", v1::JobStatus());
    ASSERT_TRUE(id.ok());
    b = *id;
    EXPECT_NE(a, b);
    auto queued = (*store)->InState(v1::JOB_STATE_QUEUED);
    ASSERT_TRUE(queued.ok());
    EXPECT_EQ(*queued, (std::vector<std::string>{a, b}));  // submission order
    auto job = (*store)->Get(a);
    ASSERT_TRUE(job.ok());
    job->status.set_state(v1::JOB_STATE_RUNNING);
    job->status.add_losses(0.5f);
    ASSERT_TRUE((*store)->Update(job->status).ok());
    ASSERT_TRUE((*store)->AddEvent(a, "started").ok());
  }
  auto store = JobStore::Open(path);
  ASSERT_TRUE(store.ok());
  auto job = (*store)->Get(a);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->spec.name(), "first");
  EXPECT_EQ(job->status.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job->status.losses_size(), 1);
  auto running = (*store)->InState(v1::JOB_STATE_RUNNING);
  ASSERT_TRUE(running.ok());
  EXPECT_EQ(*running, std::vector<std::string>{a});
  auto queued = (*store)->InState(v1::JOB_STATE_QUEUED);
  ASSERT_TRUE(queued.ok());
  EXPECT_EQ(*queued, std::vector<std::string>{b});
  auto list = (*store)->List();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[0].losses_size(), 0);  // lists leave the losses out
  EXPECT_TRUE(absl::IsNotFound((*store)->Get("job-999").status()));
  auto counts = (*store)->CountByState();
  ASSERT_TRUE(counts.ok()) << counts.status();
  EXPECT_EQ(*counts, (std::map<v1::JobState, int>{{v1::JOB_STATE_QUEUED, 1}, {v1::JOB_STATE_RUNNING, 1}}));
}

// A running job's status saved once a second leaves its per-step series
// out: Get gives the scalars last saved with the series last saved (a state
// change's, a checkpoint's), and the step those series end at (they hold a
// job's last steps: BoundSeries).
TEST(JobStore, ASaveWithoutTheSeriesKeepsTheOnesSavedBefore) {
  auto store = JobStore::Open(":memory:");
  ASSERT_TRUE(store.ok()) << store.status();
  auto id = (*store)->Insert(v1::JobSpec(), "", v1::JobStatus());
  ASSERT_TRUE(id.ok()) << id.status();
  auto job = (*store)->Get(*id);
  ASSERT_TRUE(job.ok());
  v1::JobStatus& s = job->status;
  s.set_state(v1::JOB_STATE_RUNNING);
  for (int i = 0; i < 3; ++i) {
    s.add_losses(1.0f + i);
    s.add_lrs(0.1);
    s.add_grad_norms(2.0 + i);
    s.add_step_seconds(0.5);
  }
  s.set_step(3);
  ASSERT_TRUE((*store)->Update(s).ok());
  s.add_losses(9.0f);
  s.add_lrs(0.1);
  s.set_step(4);
  ASSERT_TRUE((*store)->Update(s, /*with_series=*/false).ok());
  auto got = (*store)->Get(*id);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->status.step(), 3);
  ASSERT_EQ(got->status.losses_size(), 3);
  EXPECT_EQ(got->status.losses(2), 3.0f);
  EXPECT_EQ(got->status.grad_norms_size(), 3);
  EXPECT_EQ(got->status.step_seconds_size(), 3);
  ASSERT_TRUE((*store)->Update(s).ok());  // with the series again
  got = (*store)->Get(*id);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->status.losses_size(), 4);
  auto list = (*store)->List();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].losses_size() + (*list)[0].lrs_size(), 0);
  ASSERT_TRUE((*list)[0].has_grad_norm()) << "a list keeps the last step's figures";
  EXPECT_EQ((*list)[0].grad_norm(), 4.0);
}

// A database made before the series had a column of their own: its rows'
// series are in their status, and it opens with them there.
TEST(JobStore, ADatabaseFromBeforeTheSeriesColumnKeepsItsJobsSeries) {
  const testing::ScopedTempDir folder("job-store");
  const std::string path = folder.path() + "/jobs.db";
  v1::JobStatus old;
  old.set_job_id("job-1");
  old.set_state(v1::JOB_STATE_SUCCEEDED);
  old.set_step(2);
  old.add_losses(0.5f);
  old.add_losses(0.25f);
  old.add_grad_norms(1.5);
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
    const std::string sql =
        "CREATE TABLE jobs (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE, name TEXT NOT NULL,"
        " spec_yaml TEXT NOT NULL, spec BLOB NOT NULL, state INTEGER NOT NULL, status BLOB NOT NULL,"
        " submitted_ms INTEGER NOT NULL, updated_ms INTEGER NOT NULL);";
    ASSERT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK);
    sqlite3_stmt* ins = nullptr;
    ASSERT_EQ(sqlite3_prepare_v2(db,
                                 "INSERT INTO jobs (id, name, spec_yaml, spec, state, status, submitted_ms, updated_ms) "
                                 "VALUES ('job-1', 'old', '', x'', 3, ?, 0, 0);",
                                 -1, &ins, nullptr),
              SQLITE_OK);
    const std::string blob = old.SerializeAsString();
    sqlite3_bind_blob(ins, 1, blob.data(), static_cast<int>(blob.size()), SQLITE_TRANSIENT);
    EXPECT_EQ(sqlite3_step(ins), SQLITE_DONE);
    sqlite3_finalize(ins);
    sqlite3_close(db);
  }
  auto store = JobStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  auto job = (*store)->Get("job-1");
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->status.losses_size(), 2);
  EXPECT_EQ(job->status.losses(1), 0.25f);
  EXPECT_EQ(job->status.grad_norms_size(), 1);
  // Saved again, its series move to their own column.
  job->status.set_step(3);
  ASSERT_TRUE((*store)->Update(job->status).ok());
  auto again = (*store)->Get("job-1");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->status.losses_size(), 2);
  EXPECT_EQ(again->status.step(), 3);
}

// A stage's record of its checkpoint of `step`.
v1::CheckpointRecord CheckpointOfStep(int64_t step) {
  v1::CheckpointRecord r;
  r.set_step(step);
  r.set_path("/ckpt/" + std::to_string(step));
  return r;
}

TEST(JobStore, OnlyStepsCheckpointedOnEveryStageAreComplete) {
  auto store = JobStore::Open(":memory:");
  ASSERT_TRUE(store.ok());
  v1::JobSpec spec;
  auto id = (*store)->Insert(spec, "", v1::JobStatus());
  ASSERT_TRUE(id.ok());
  auto status = (*store)->Get(*id)->status;
  // Step 10 on all three stages, step 20 on two of them (a stage died).
  status.set_step(10);
  status.add_losses(1.0f);
  ASSERT_TRUE((*store)
                  ->RecordCheckpoints(status, {{0, CheckpointOfStep(10)}, {1, CheckpointOfStep(10)},
                                               {2, CheckpointOfStep(10)}})
                  .ok());
  ASSERT_TRUE((*store)->RecordCheckpoints(status, {{0, CheckpointOfStep(20)}, {2, CheckpointOfStep(20)}}).ok());
  auto complete = (*store)->CompleteCheckpoints(*id, 3);
  ASSERT_TRUE(complete.ok());
  auto steps = [](const std::vector<JobStore::CompleteCheckpoint>& c) {
    std::vector<int64_t> out;
    for (const auto& cp : c) out.push_back(cp.step);
    return out;
  };
  EXPECT_EQ(steps(*complete), std::vector<int64_t>{10});
  ASSERT_TRUE((*store)->RecordCheckpoints(status, {{1, CheckpointOfStep(20)}}).ok());
  EXPECT_EQ(steps(*(*store)->CompleteCheckpoints(*id, 3)), (std::vector<int64_t>{20, 10}));
  // The status was saved with the records.
  EXPECT_EQ((*store)->Get(*id)->status.step(), 10);
  ASSERT_TRUE((*store)->DropCheckpoints(*id, 20).ok());
  EXPECT_EQ(steps(*(*store)->CompleteCheckpoints(*id, 3)), std::vector<int64_t>{10});
  EXPECT_TRUE((*store)->CompleteCheckpoints("job-404", 3)->empty());
  // A job that lost a server goes on under a cut of 2 stages: its steps are
  // complete with 2 records, each checkpoint with the cut it was written under.
  ASSERT_TRUE((*store)->RecordCheckpoints(status, {{0, CheckpointOfStep(30)}, {1, CheckpointOfStep(30)}}, 2).ok());
  ASSERT_TRUE((*store)->RecordCheckpoints(status, {{0, CheckpointOfStep(40)}}, 2).ok());
  complete = (*store)->CompleteCheckpoints(*id, 3);
  ASSERT_TRUE(complete.ok());
  EXPECT_EQ(steps(*complete), (std::vector<int64_t>{30, 10}));
  EXPECT_EQ((*complete)[0].stages, 2);
  EXPECT_EQ((*complete)[1].stages, 3);
}

// keep_checkpoints: each stage's records past its newest `keep` go, as the
// stage's files do; a long job's table stays its size.
TEST(JobStore, RecordsPastTheNewestKeptAreDropped) {
  auto store = JobStore::Open(":memory:");
  ASSERT_TRUE(store.ok());
  auto id = (*store)->Insert(v1::JobSpec(), "", v1::JobStatus());
  ASSERT_TRUE(id.ok());
  auto status = (*store)->Get(*id)->status;
  for (int64_t step = 10; step <= 1000; step += 10) {
    status.set_step(step);
    ASSERT_TRUE(
        (*store)->RecordCheckpoints(status, {{0, CheckpointOfStep(step)}, {1, CheckpointOfStep(step)}}, 0, 3).ok());
  }
  auto complete = (*store)->CompleteCheckpoints(*id, 2);
  ASSERT_TRUE(complete.ok()) << complete.status();
  std::vector<int64_t> steps;
  for (const auto& c : *complete) steps.push_back(c.step);
  EXPECT_EQ(steps, (std::vector<int64_t>{1000, 990, 980}));
  // Without `keep`, every record stays.
  ASSERT_TRUE(
      (*store)->RecordCheckpoints(status, {{0, CheckpointOfStep(1010)}, {1, CheckpointOfStep(1010)}}).ok());
  EXPECT_EQ((*store)->CompleteCheckpoints(*id, 2)->size(), 4u);
}

TEST(JobStore, UnwritablePathIsAnError) {
  auto store = JobStore::Open("/proc/no/such/dir/conveyor.db");
  EXPECT_FALSE(store.ok());
}

}  // namespace
}  // namespace conveyor
