// libFuzzer target: the job-file parser the coordinator runs on every SubmitJob.
#include <cstddef>
#include <cstdint>
#include <string>

#include "plan/job_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto spec = conveyor::ParseJobYaml(text);
  if (spec.ok()) {
    // A spec that parsed must survive the checks the servers repeat on it,
    // and one that passed them what the stages build from it.
    if (conveyor::ValidateJobSpec(*spec).ok()) (void)conveyor::MicroBatchSizes(*spec, spec->batch_size());
  }
  return 0;
}
