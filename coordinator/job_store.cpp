#include "coordinator/job_store.h"

#include <algorithm>
#include <chrono>

namespace conveyor {
int64_t NowUnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void AddStatusEvent(v1::JobStatus* status, const std::string& text) {
  constexpr int kEventsInStatus = 20;
  v1::JobEvent* e = status->add_events();
  e->set_unix_ms(NowUnixMs());
  e->set_text(text);
  auto* events = status->mutable_events();
  if (events->size() > kEventsInStatus) events->DeleteSubrange(0, events->size() - kEventsInStatus);
}

void SwapSeries(v1::JobStatus* a, v1::JobStatus* b) {
  a->mutable_losses()->Swap(b->mutable_losses());
  a->mutable_lrs()->Swap(b->mutable_lrs());
  a->mutable_grad_norms()->Swap(b->mutable_grad_norms());
  a->mutable_loss_scales()->Swap(b->mutable_loss_scales());
  a->mutable_step_seconds()->Swap(b->mutable_step_seconds());
}

void KeepLastOfSeries(v1::JobStatus* status, const v1::JobStatus& series) {
  if (series.lrs_size() > 0) status->set_lr(series.lrs(series.lrs_size() - 1));
  if (series.grad_norms_size() > 0) status->set_grad_norm(series.grad_norms(series.grad_norms_size() - 1));
  if (series.loss_scales_size() > 0) status->set_loss_scale(series.loss_scales(series.loss_scales_size() - 1));
}

namespace {

// Calls `f` on each of the per-step series of `status`.
template <typename F>
void ForEachSeries(v1::JobStatus* status, F f) {
  f(status->mutable_losses());
  f(status->mutable_lrs());
  f(status->mutable_grad_norms());
  f(status->mutable_loss_scales());
  f(status->mutable_step_seconds());
}

}  // namespace

// Every series starts at the same step: the oldest elements are dropped from
// all of them alike (a step that failed after its norm and learning rate were
// added leaves those two one longer until the job goes back to a checkpoint).
void BoundSeries(v1::JobStatus* status, int keep) {
  if (status->losses_size() <= keep + keep / 4) return;
  const int drop = status->losses_size() - keep;
  ForEachSeries(status, [drop](auto* series) {
    series->erase(series->begin(), series->begin() + std::min(drop, series->size()));
  });
}

int64_t SeriesFirstStep(const v1::JobStatus& status) { return status.step() - status.losses_size() + 1; }

void TruncateSeries(v1::JobStatus* status, int64_t step) {
  // The losses end at the status's step; every series starts where they do.
  const int64_t keep = std::max<int64_t>(0, status->losses_size() - (status->step() - step));
  ForEachSeries(status, [keep](auto* series) {
    if (series->size() > keep) series->Truncate(static_cast<int>(keep));
  });
}

namespace {

// A prepared statement, finalised on scope exit.
class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql) : db_(db) { rc_ = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr); }
  ~Stmt() { sqlite3_finalize(stmt_); }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;

  Status status() const {
    if (rc_ == SQLITE_OK || rc_ == SQLITE_ROW || rc_ == SQLITE_DONE) return absl::OkStatus();
    return absl::InternalError(std::string("job database: ") + sqlite3_errmsg(db_));
  }
  void Bind(int i, const std::string& s) { sqlite3_bind_blob(stmt_, i, s.data(), static_cast<int>(s.size()), SQLITE_TRANSIENT); }
  void BindText(int i, const std::string& s) { sqlite3_bind_text(stmt_, i, s.c_str(), -1, SQLITE_TRANSIENT); }
  void Bind(int i, int64_t v) { sqlite3_bind_int64(stmt_, i, v); }
  void Bind(int i, double v) { sqlite3_bind_double(stmt_, i, v); }
  void BindNull(int i) { sqlite3_bind_null(stmt_, i); }
  // For a statement run again with new values.
  void Reset() {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
  }
  // True while there is a row; errors end the loop and show in status().
  bool Step() {
    rc_ = sqlite3_step(stmt_);
    return rc_ == SQLITE_ROW;
  }
  std::string Blob(int col) {
    const void* p = sqlite3_column_blob(stmt_, col);
    return p ? std::string(static_cast<const char*>(p), sqlite3_column_bytes(stmt_, col)) : std::string();
  }
  std::string Text(int col) {
    const unsigned char* p = sqlite3_column_text(stmt_, col);
    return p ? reinterpret_cast<const char*>(p) : "";
  }
  int64_t Int(int col) { return sqlite3_column_int64(stmt_, col); }
  double Real(int col) { return sqlite3_column_double(stmt_, col); }
  bool IsNull(int col) { return sqlite3_column_type(stmt_, col) == SQLITE_NULL; }

 private:
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
  int rc_;
};

// The tables, made where missing.
constexpr char kJobStoreSchema[] =
    "PRAGMA journal_mode=WAL;"
    "PRAGMA synchronous=NORMAL;"
    // The write-ahead log keeps the size of its largest run of writes between
    // checkpoints unless told otherwise; past 1 MiB it is cut back after each.
    "PRAGMA journal_size_limit=1048576;"
    "CREATE TABLE IF NOT EXISTS jobs ("
    "  seq INTEGER PRIMARY KEY AUTOINCREMENT,"
    "  id TEXT UNIQUE,"
    "  name TEXT NOT NULL,"
    "  spec_yaml TEXT NOT NULL,"
    "  spec BLOB NOT NULL,"
    "  state INTEGER NOT NULL,"
    "  status BLOB NOT NULL,"
    "  submitted_ms INTEGER NOT NULL,"
    "  updated_ms INTEGER NOT NULL);"
    "CREATE TABLE IF NOT EXISTS traces ("
    "  job_id TEXT NOT NULL,"
    "  step INTEGER NOT NULL,"
    "  trace BLOB NOT NULL,"
    "  PRIMARY KEY (job_id, step));"
    "CREATE TABLE IF NOT EXISTS checkpoints ("
    "  job_id TEXT NOT NULL,"
    "  step INTEGER NOT NULL,"
    "  stage INTEGER NOT NULL,"
    "  path TEXT NOT NULL,"
    "  bytes INTEGER NOT NULL,"
    "  sha256 TEXT NOT NULL,"
    "  at_ms INTEGER NOT NULL,"
    "  PRIMARY KEY (job_id, step, stage));"
    "CREATE TABLE IF NOT EXISTS job_events ("
    "  job_id TEXT NOT NULL,"
    "  at_ms INTEGER NOT NULL,"
    "  event TEXT NOT NULL);"
    "CREATE TABLE IF NOT EXISTS curve_steps ("
    "  job_id TEXT NOT NULL,"
    "  step INTEGER NOT NULL,"
    "  loss REAL NOT NULL,"
    "  lr REAL NOT NULL,"
    "  grad_norm REAL,"  // NULL: the job has none
    "  step_seconds REAL NOT NULL,"
    "  samples_per_second REAL NOT NULL,"
    "  tokens_per_second REAL NOT NULL,"
    "  at_ms INTEGER NOT NULL,"
    "  PRIMARY KEY (job_id, step));"
    "CREATE TABLE IF NOT EXISTS curve_evals ("
    "  job_id TEXT NOT NULL,"
    "  step INTEGER NOT NULL,"
    "  loss REAL NOT NULL,"
    "  accuracy REAL NOT NULL,"
    "  at_ms INTEGER NOT NULL,"
    "  PRIMARY KEY (job_id, step));"
    // The scheduler's queue (InState) and the jobs' counts by state read it.
    "CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs (state, seq);";

}  // namespace

// Columns that came later: a database made before gets them, NULL in its
// old rows (whose status blobs still hold the series; whose checkpoints'
// cut is the job's planned one).
Status JobStore::AddColumnIfMissing(const std::string& table, const std::string& column, const std::string& type) {
  bool has = false;
  {
    Stmt q(db_, ("SELECT name FROM pragma_table_info('" + table + "');").c_str());
    while (q.Step()) has = has || q.Text(0) == column;
    CONVEYOR_RETURN_IF_ERROR(q.status());
  }
  return has ? absl::OkStatus() : Exec("ALTER TABLE " + table + " ADD COLUMN " + column + " " + type + ";");
}

StatusOr<std::unique_ptr<JobStore>> JobStore::Open(const std::string& path) {
  sqlite3* db = nullptr;
  if (sqlite3_open(path.c_str(), &db) != SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return absl::FailedPreconditionError("cannot open job database " + path + ": " + msg);
  }
  sqlite3_busy_timeout(db, 5000);
  std::unique_ptr<JobStore> store(new JobStore(db));
  CONVEYOR_RETURN_IF_ERROR(store->Exec(kJobStoreSchema));
  // series: a JobStatus holding only the per-step series; cut_stages: how
  // many stages wrote a checkpoint's files (a job that lost a server goes on
  // under another cut).
  CONVEYOR_RETURN_IF_ERROR(store->AddColumnIfMissing("jobs", "series", "BLOB"));
  CONVEYOR_RETURN_IF_ERROR(store->AddColumnIfMissing("checkpoints", "cut_stages", "INTEGER"));
  return store;
}

JobStore::~JobStore() { sqlite3_close(db_); }

Status JobStore::Exec(const std::string& sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : "unknown error";
    sqlite3_free(err);
    return absl::InternalError("job database: " + msg);
  }
  return absl::OkStatus();
}

StatusOr<std::string> JobStore::Insert(const v1::JobSpec& spec, const std::string& yaml, v1::JobStatus status) {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t now = NowUnixMs();
  CONVEYOR_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE;"));
  Stmt ins(db_,
           "INSERT INTO jobs (name, spec_yaml, spec, state, status, submitted_ms, updated_ms) "
           "VALUES (?, ?, ?, ?, ?, ?, ?);");
  ins.BindText(1, spec.name());
  ins.BindText(2, yaml);
  ins.Bind(3, spec.SerializeAsString());
  ins.Bind(4, static_cast<int64_t>(v1::JOB_STATE_QUEUED));
  ins.Bind(5, std::string());
  ins.Bind(6, now);
  ins.Bind(7, now);
  ins.Step();
  if (!ins.status().ok()) {
    Exec("ROLLBACK;").IgnoreError();
    return ins.status();
  }
  const std::string id = "job-" + std::to_string(sqlite3_last_insert_rowid(db_));
  status.set_job_id(id);
  status.set_name(spec.name());
  status.set_state(v1::JOB_STATE_QUEUED);
  status.set_submitted_unix_ms(now);
  Stmt upd(db_, "UPDATE jobs SET id = ?, status = ? WHERE seq = ?;");
  upd.BindText(1, id);
  upd.Bind(2, status.SerializeAsString());
  upd.Bind(3, static_cast<int64_t>(sqlite3_last_insert_rowid(db_)));
  upd.Step();
  if (!upd.status().ok()) {
    Exec("ROLLBACK;").IgnoreError();
    return upd.status();
  }
  CONVEYOR_RETURN_IF_ERROR(Exec("COMMIT;"));
  return id;
}

Status JobStore::Update(const v1::JobStatus& status, bool with_series) {
  std::lock_guard<std::mutex> lock(mu_);
  return UpdateLocked(status, with_series);
}

Status JobStore::UpdateLocked(const v1::JobStatus& status, bool with_series) {
  // The status without its series, and (with_series) the series alone; a
  // copy in memory costs little beside serialising and writing them.
  v1::JobStatus unseries = status, series;
  SwapSeries(&unseries, &series);
  KeepLastOfSeries(&unseries, series);  // what a list of jobs shows of them
  const std::string blob = unseries.SerializeAsString();
  Stmt upd(db_, with_series ? "UPDATE jobs SET state = ?, status = ?, updated_ms = ?, series = ? WHERE id = ?;"
                            : "UPDATE jobs SET state = ?, status = ?, updated_ms = ? WHERE id = ?;");
  upd.Bind(1, static_cast<int64_t>(status.state()));
  upd.Bind(2, blob);
  upd.Bind(3, NowUnixMs());
  // The series' own step: the step of their last elements, which the
  // status's step passes between two saves with series (Get).
  series.set_step(status.step());
  if (with_series) upd.Bind(4, series.SerializeAsString());
  upd.BindText(with_series ? 5 : 4, status.job_id());
  upd.Step();
  return upd.status();
}

StatusOr<std::string> JobStore::SpecYaml(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt q(db_, "SELECT spec_yaml FROM jobs WHERE id = ?;");
  q.BindText(1, job_id);
  if (!q.Step()) {
    CONVEYOR_RETURN_IF_ERROR(q.status());
    return absl::NotFoundError("no job " + job_id);
  }
  return q.Text(0);
}

Status JobStore::UpdateSpec(const std::string& job_id, const v1::JobSpec& spec, const std::string& yaml) {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt upd(db_, "UPDATE jobs SET spec = ?, spec_yaml = ?, updated_ms = ? WHERE id = ?;");
  upd.Bind(1, spec.SerializeAsString());
  upd.BindText(2, yaml);
  upd.Bind(3, NowUnixMs());
  upd.BindText(4, job_id);
  upd.Step();
  return upd.status();
}

Status JobStore::AddEvent(const std::string& job_id, const std::string& event) {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt ins(db_, "INSERT INTO job_events (job_id, at_ms, event) VALUES (?, ?, ?);");
  ins.BindText(1, job_id);
  ins.Bind(2, NowUnixMs());
  ins.BindText(3, event);
  ins.Step();
  return ins.status();
}

StatusOr<StoredJob> JobStore::Get(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt q(db_, "SELECT spec, status, series FROM jobs WHERE id = ?;");
  q.BindText(1, job_id);
  if (!q.Step()) {
    CONVEYOR_RETURN_IF_ERROR(q.status());
    return absl::NotFoundError("no job '" + job_id + "'");
  }
  StoredJob job;
  if (!job.spec.ParseFromString(q.Blob(0)) || !job.status.ParseFromString(q.Blob(1)))
    return absl::DataLossError("job database: job " + job_id + " is corrupt");
  if (!q.IsNull(2)) {  // NULL: a row from before the column, its series in its status
    v1::JobStatus series;
    if (!series.ParseFromString(q.Blob(2))) return absl::DataLossError("job database: job " + job_id + "'s series are corrupt");
    // The series end at their own step (saved before it, they held every
    // step from the first); a running job's status saved since has gone on.
    const int64_t end = series.step() > 0 ? series.step() : std::max(series.losses_size(), series.lrs_size());
    SwapSeries(&job.status, &series);
    if (end < job.status.step()) job.status.set_step(end);
  }
  return job;
}

StatusOr<std::vector<v1::JobStatus>> JobStore::List() {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt q(db_, "SELECT status FROM jobs ORDER BY seq;");
  std::vector<v1::JobStatus> out;
  while (q.Step()) {
    v1::JobStatus s;
    if (!s.ParseFromString(q.Blob(0))) return absl::DataLossError("job database: a job is corrupt");
    v1::JobStatus series;
    SwapSeries(&s, &series);  // rows from before the series column hold them
    KeepLastOfSeries(&s, series);
    out.push_back(std::move(s));
  }
  CONVEYOR_RETURN_IF_ERROR(q.status());
  return out;
}

StatusOr<std::map<v1::JobState, int>> JobStore::CountByState() {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt q(db_, "SELECT state, COUNT(*) FROM jobs GROUP BY state;");
  std::map<v1::JobState, int> out;
  while (q.Step()) {
    const int64_t state = q.Int(0);
    if (v1::JobState_IsValid(static_cast<int>(state))) out[static_cast<v1::JobState>(state)] = static_cast<int>(q.Int(1));
  }
  CONVEYOR_RETURN_IF_ERROR(q.status());
  return out;
}

Status JobStore::SaveTraces(const std::string& job_id, const std::vector<v1::StepTrace>& traces) {
  std::lock_guard<std::mutex> lock(mu_);
  CONVEYOR_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE;"));
  Stmt del(db_, "DELETE FROM traces WHERE job_id = ?;");
  del.BindText(1, job_id);
  del.Step();
  Status st = del.status();
  for (const auto& t : traces) {
    if (!st.ok()) break;
    Stmt ins(db_, "INSERT INTO traces (job_id, step, trace) VALUES (?, ?, ?);");
    ins.BindText(1, job_id);
    ins.Bind(2, t.step());
    ins.Bind(3, t.SerializeAsString());
    ins.Step();
    st = ins.status();
  }
  if (!st.ok()) {
    Exec("ROLLBACK;").IgnoreError();
    return st;
  }
  return Exec("COMMIT;");
}

StatusOr<std::vector<v1::StepTrace>> JobStore::Traces(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt q(db_, "SELECT trace FROM traces WHERE job_id = ? ORDER BY step;");
  q.BindText(1, job_id);
  std::vector<v1::StepTrace> out;
  while (q.Step()) {
    v1::StepTrace t;
    if (!t.ParseFromString(q.Blob(0))) return absl::DataLossError("job database: a trace of " + job_id + " is corrupt");
    out.push_back(std::move(t));
  }
  CONVEYOR_RETURN_IF_ERROR(q.status());
  return out;
}

Status JobStore::RecordCheckpoints(const v1::JobStatus& status,
                                   const std::vector<std::pair<int, v1::CheckpointRecord>>& records, int cut_stages,
                                   int keep) {
  std::lock_guard<std::mutex> lock(mu_);
  CONVEYOR_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE;"));
  Status st;
  for (const auto& [stage, r] : records) {
    Stmt ins(db_,
             "INSERT OR REPLACE INTO checkpoints (job_id, step, stage, path, bytes, sha256, at_ms, cut_stages) "
             "VALUES (?, ?, ?, ?, ?, ?, ?, ?);");
    ins.BindText(1, status.job_id());
    ins.Bind(2, r.step());
    ins.Bind(3, static_cast<int64_t>(stage));
    ins.BindText(4, r.path());
    ins.Bind(5, r.bytes());
    ins.BindText(6, r.sha256());
    ins.Bind(7, NowUnixMs());
    if (cut_stages > 0) {
      ins.Bind(8, static_cast<int64_t>(cut_stages));
    } else {
      ins.BindNull(8);
    }
    ins.Step();
    st = ins.status();
    if (!st.ok()) break;
    if (keep > 0) st = PruneCheckpointsLocked(status.job_id(), stage, std::max(2, keep));
    if (!st.ok()) break;
  }
  if (st.ok()) st = UpdateLocked(status, /*with_series=*/true);
  if (!st.ok()) {
    Exec("ROLLBACK;").IgnoreError();
    return st;
  }
  return Exec("COMMIT;");
}

Status JobStore::PruneCheckpointsLocked(const std::string& job_id, int stage, int keep) {
  Stmt del(db_,
           "DELETE FROM checkpoints WHERE job_id = ?1 AND stage = ?2 AND step < (SELECT MIN(step) FROM "
           "(SELECT step FROM checkpoints WHERE job_id = ?1 AND stage = ?2 ORDER BY step DESC LIMIT ?3));");
  del.BindText(1, job_id);
  del.Bind(2, static_cast<int64_t>(stage));
  del.Bind(3, static_cast<int64_t>(keep));
  del.Step();
  return del.status();
}

StatusOr<std::vector<JobStore::CompleteCheckpoint>> JobStore::CompleteCheckpoints(const std::string& job_id,
                                                                                   int stages) {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt q(db_,
         "SELECT step, MAX(COALESCE(cut_stages, ?1)) AS cut FROM checkpoints WHERE job_id = ?2 GROUP BY step "
         "HAVING COUNT(DISTINCT stage) = cut AND MAX(stage) < cut AND MIN(COALESCE(cut_stages, ?1)) = cut "
         "ORDER BY step DESC;");
  q.Bind(1, static_cast<int64_t>(stages));
  q.BindText(2, job_id);
  std::vector<CompleteCheckpoint> steps;
  while (q.Step()) steps.push_back({q.Int(0), static_cast<int>(q.Int(1))});
  CONVEYOR_RETURN_IF_ERROR(q.status());
  return steps;
}

Status JobStore::DropCheckpoints(const std::string& job_id, int64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt del(db_, "DELETE FROM checkpoints WHERE job_id = ? AND step = ?;");
  del.BindText(1, job_id);
  del.Bind(2, step);
  del.Step();
  return del.status();
}

Status JobStore::AddCurves(const std::string& job_id, const std::vector<v1::CurvePoint>& steps,
                           const std::vector<v1::EvalPoint>& evals) {
  if (steps.empty() && evals.empty()) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(mu_);
  CONVEYOR_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE;"));
  Status st;
  {
    Stmt ins(db_,
             "INSERT OR REPLACE INTO curve_steps (job_id, step, loss, lr, grad_norm, step_seconds, "
             "samples_per_second, tokens_per_second, at_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?);");
    for (const v1::CurvePoint& p : steps) {
      ins.Reset();
      ins.BindText(1, job_id);
      ins.Bind(2, p.step());
      ins.Bind(3, p.loss());
      ins.Bind(4, p.lr());
      if (p.has_grad_norm()) {
        ins.Bind(5, p.grad_norm());
      } else {
        ins.BindNull(5);
      }
      ins.Bind(6, p.step_seconds());
      ins.Bind(7, p.samples_per_second());
      ins.Bind(8, p.tokens_per_second());
      ins.Bind(9, p.unix_ms());
      ins.Step();
      st = ins.status();
      if (!st.ok()) break;
    }
  }
  if (st.ok()) {
    Stmt ins(db_, "INSERT OR REPLACE INTO curve_evals (job_id, step, loss, accuracy, at_ms) VALUES (?, ?, ?, ?, ?);");
    for (const v1::EvalPoint& e : evals) {
      ins.Reset();
      ins.BindText(1, job_id);
      ins.Bind(2, e.step());
      ins.Bind(3, e.loss());
      ins.Bind(4, e.accuracy());
      ins.Bind(5, e.unix_ms());
      ins.Step();
      st = ins.status();
      if (!st.ok()) break;
    }
  }
  if (st.ok()) st = ThinCurvesLocked(job_id);
  if (!st.ok()) {
    Exec("ROLLBACK;").IgnoreError();
    return st;
  }
  return Exec("COMMIT;");
}

// A week-long job at hundreds of steps a second would otherwise add a row a
// step for ever (about 100 bytes each); a picture or a CSV of the run needs
// thousands of points, not millions.
Status JobStore::ThinCurvesLocked(const std::string& job_id) {
  auto count = [&](int64_t stride) -> StatusOr<int64_t> {
    Stmt q(db_, "SELECT count(*) FROM curve_steps WHERE job_id = ? AND (step - 1) % ? = 0;");
    q.BindText(1, job_id);
    q.Bind(2, stride);
    const int64_t n = q.Step() ? q.Int(0) : 0;
    CONVEYOR_RETURN_IF_ERROR(q.status());
    return n;
  };
  CONVEYOR_ASSIGN_OR_RETURN(int64_t rows, count(1));
  if (rows <= 2 * kCurveRows) return absl::OkStatus();
  int64_t stride = 2;
  for (;;) {
    CONVEYOR_ASSIGN_OR_RETURN(rows, count(stride));
    if (rows <= kCurveRows) break;
    stride *= 2;
  }
  Stmt del(db_,
           "DELETE FROM curve_steps WHERE job_id = ?1 AND (step - 1) % ?2 != 0 "
           "AND step < (SELECT max(step) FROM curve_steps WHERE job_id = ?1);");
  del.BindText(1, job_id);
  del.Bind(2, stride);
  del.Step();
  return del.status();
}

Status JobStore::DropCurves(const std::string& job_id, int64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const char* sql : {"DELETE FROM curve_steps WHERE job_id = ? AND step > ?;",
                          "DELETE FROM curve_evals WHERE job_id = ? AND step > ?;"}) {
    Stmt del(db_, sql);
    del.BindText(1, job_id);
    del.Bind(2, step);
    del.Step();
    CONVEYOR_RETURN_IF_ERROR(del.status());
  }
  return absl::OkStatus();
}

StatusOr<v1::Curves> JobStore::Curves(const std::string& job_id, int64_t after_step) {
  std::lock_guard<std::mutex> lock(mu_);
  v1::Curves out;
  out.set_job_id(job_id);
  Stmt q(db_,
         "SELECT step, loss, lr, grad_norm, step_seconds, samples_per_second, tokens_per_second, at_ms "
         "FROM curve_steps WHERE job_id = ? AND step > ? ORDER BY step;");
  q.BindText(1, job_id);
  q.Bind(2, after_step);
  while (q.Step()) {
    v1::CurvePoint* p = out.add_steps();
    p->set_step(q.Int(0));
    p->set_loss(q.Real(1));
    p->set_lr(q.Real(2));
    p->set_has_grad_norm(!q.IsNull(3));
    p->set_grad_norm(q.Real(3));
    p->set_step_seconds(q.Real(4));
    p->set_samples_per_second(q.Real(5));
    p->set_tokens_per_second(q.Real(6));
    p->set_unix_ms(q.Int(7));
  }
  CONVEYOR_RETURN_IF_ERROR(q.status());
  Stmt e(db_, "SELECT step, loss, accuracy, at_ms FROM curve_evals WHERE job_id = ? AND step > ? ORDER BY step;");
  e.BindText(1, job_id);
  e.Bind(2, after_step);
  while (e.Step()) {
    v1::EvalPoint* p = out.add_evals();
    p->set_step(e.Int(0));
    p->set_loss(e.Real(1));
    p->set_accuracy(e.Real(2));
    p->set_unix_ms(e.Int(3));
  }
  CONVEYOR_RETURN_IF_ERROR(e.status());
  return out;
}

StatusOr<std::vector<std::string>> JobStore::InState(v1::JobState state) {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt q(db_, "SELECT id FROM jobs WHERE state = ? ORDER BY seq;");
  q.Bind(1, static_cast<int64_t>(state));
  std::vector<std::string> ids;
  while (q.Step()) ids.push_back(q.Text(0));
  CONVEYOR_RETURN_IF_ERROR(q.status());
  return ids;
}

}  // namespace conveyor
