// load_bench's three modes (load_bench.cpp says what each does).
#pragma once

#include <string>
#include <vector>

namespace conveyor::bench {

struct LoadOptions {
  std::string coordinator, job_file, ids_out;
  int jobs = 1000, clients = 20, watchers = 100;
  double rate = 200, seconds = 60;
  std::vector<std::string> allow;  // error codes' names that do not fail the run
};
// Returns the exit code: 0, or 1 on an error not allowed.
int RunLoad(const LoadOptions& options);

// Returns 0 when every id in `ids_file` is listed with a valid state.
int RunCheck(const std::string& coordinator, const std::string& ids_file);

struct AbuseOptions {
  std::string stage;
  int clients = 16;
  double seconds = 20;
};
// Returns 0 when the stage server still answers afterwards.
int RunAbuse(const AbuseOptions& options);

}  // namespace conveyor::bench
