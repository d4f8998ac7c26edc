#include "plan/placement.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_join.h"

#include "plan/job_spec.h"

namespace conveyor {
namespace {

std::string List(const std::vector<int>& v) { return "[" + absl::StrJoin(v, ", ") + "]"; }  // a YAML list

}  // namespace

GpuFold FoldOntoGpus(const v1::JobSpec& spec, int gpus) {
  GpuFold fold;
  const auto& part = spec.partition();
  const int stages = std::max(1, part.stages());  // ParseJobYaml sets it from boundaries where only they are given
  const int replicas = Replicas(spec);
  fold.stages = fold.folded = stages;
  if (gpus <= 0 || stages * replicas <= gpus) return fold;
  const int target = gpus / replicas;
  const std::string over = std::to_string(stages * replicas) + " stage servers on " + std::to_string(gpus) + " GPUs";
  if (target < 1) {
    fold.why_not = over + ": more replicas (" + std::to_string(replicas) + ") than GPUs";
    return fold;
  }
  if (spec.schedule() == v1::SCHEDULE_INTERLEAVED) {
    fold.why_not = over + ": the interleaved schedule places its chunks on the job's " + std::to_string(stages) +
                   " stages";
    return fold;
  }
  if (spec.inject_inf_gradients_size() > 0) {  // a test's key: its stage indices stay as written
    fold.why_not = over + ": inject_inf_gradients names the job's stages";
    return fold;
  }
  if ((part.boundaries_size() > 0 || spec.recompute_stages_size() > 0) && stages % target != 0) {
    fold.why_not = over + ": the job's boundaries or per-stage keys name " + std::to_string(stages) +
                   " stages, which do not fold evenly onto " + std::to_string(target);
    return fold;
  }
  const int k = stages / target;  // job stages per folded stage where it divides
  fold.folded = target;
  fold.sets.push_back("partition.stages=" + std::to_string(target));
  if (part.boundaries_size() > 0) {
    std::vector<int> kept;
    for (int j = 1; j < target; ++j) kept.push_back(part.boundaries(j * k - 1));
    fold.sets.push_back("partition.boundaries=" + List(kept));
  }
  if (spec.recompute_stages_size() > 0) {
    std::set<int> folded;
    for (int s : spec.recompute_stages()) folded.insert(s / k);
    fold.sets.push_back("recompute=" + List(std::vector<int>(folded.begin(), folded.end())));
  }
  return fold;
}

}  // namespace conveyor
