// Job keys set on the command line (`conveyor submit|local|train JOB --set
// optimizer.lr=0.01`), as Hydra's and torchtitan's overrides: each names a
// dotted key of the job-key table (plan/job_keys.h) and a YAML value, and
// replaces or adds that key in the job file's text. The result is checked as
// a job file is (ParseJobYaml): a value is typed and ranged by the table.
// Torch-free.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace conveyor {

// The job file `yaml_text` with every override of `sets` ("KEY=VALUE")
// applied in order, as YAML text: the effective job. A key's value is YAML
// ("0.01", "adamw", "[64, 64]", "{name: sgd, lr: 0.1}"); a section written as
// one word in the file (`model: gpt`) becomes `{name: gpt}` when a key inside
// it is set. INVALID_ARGUMENT naming the override for a missing `=`, an empty
// value or a key the table does not have (with the nearest known one). The
// file's comments are not kept.
StatusOr<std::string> ApplyJobOverrides(const std::string& yaml_text, const std::vector<std::string>& sets);

}  // namespace conveyor
