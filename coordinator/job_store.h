// The coordinator's jobs, in SQLite under --state-dir: spec, state, status
// (progress, losses, results) and a history of events. A restarted
// coordinator finds its jobs there.
//
// Thread-safe (one connection, serialised by a mutex).
#pragma once

#include <sqlite3.h>

#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "conveyor.pb.h"

namespace conveyor {

// Wall-clock milliseconds since the Unix epoch, as jobs are stamped.
int64_t NowUnixMs();

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
  Status Update(const v1::JobStatus& status);
  Status AddEvent(const std::string& job_id, const std::string& event);
  StatusOr<StoredJob> Get(const std::string& job_id);
  // All jobs in submission order, without losses.
  StatusOr<std::vector<v1::JobStatus>> List();
  // The oldest QUEUED job, if any.
  StatusOr<std::optional<std::string>> NextQueued();
  // Timelines of a job's steps (replacing any kept before), and reading them back.
  Status SaveTraces(const std::string& job_id, const std::vector<v1::StepTrace>& traces);
  StatusOr<std::vector<v1::StepTrace>> Traces(const std::string& job_id);
  // Ids of jobs in `state`.
  StatusOr<std::vector<std::string>> InState(v1::JobState state);

 private:
  explicit JobStore(sqlite3* db) : db_(db) {}
  Status Exec(const std::string& sql);

  std::mutex mu_;  // serialises every use of db_
  sqlite3* db_;
};

}  // namespace conveyor
