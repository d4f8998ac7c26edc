// What the CLI prints: live progress on stderr, a summary, and the JSON object
// of --json on stdout.
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <string>

#include "conveyor.pb.h"

namespace conveyor::cli {

// Prints at most a few progress lines a second: overwriting one line on a
// terminal, one line every few seconds otherwise.
class ProgressPrinter {
 public:
  explicit ProgressPrinter(bool enabled);
  void Update(const v1::JobStatus& status);
  // Ends the progress line, if one is open.
  void Finish();

 private:
  bool enabled_;
  bool tty_;
  bool line_open_ = false;
  bool recovering_ = false;
  int epochs_printed_ = 0;
  int64_t step_printed_ = 0;  // the last step a progress line showed
  std::chrono::steady_clock::time_point last_;
};

// The --json object of a job, the same keys whatever the command and state
// (a value that does not exist yet is null): job_id, state, error, steps,
// losses, final_loss, samples_per_second, eval_accuracy, param_digest, ...
nlohmann::json ToJson(const v1::JobStatus& status);

// The coordinator's stage servers, a line each, under a heading.
std::string StagesLines(const v1::ListStagesReply& stages);

// "1 epoch", "3 epochs".
std::string Plural(int64_t n, const std::string& word);

// A human summary of a finished (or any) job, several lines.
std::string Summary(const v1::JobStatus& status);

// One line per job for `conveyor list`.
std::string ListLine(const v1::JobStatus& status);

std::string FormatDuration(double seconds);
std::string FormatBytes(int64_t bytes);

}  // namespace conveyor::cli
