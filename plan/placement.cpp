#include "plan/placement.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_join.h"

#include "common/sha256.h"
#include "plan/job_spec.h"
#include "plan/model_catalog.h"
#include "plan/schedule.h"

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

std::vector<int> MergeStages(const std::vector<int>& boundaries, int layers, int servers) {
  std::vector<int> starts{0};  // each stage's first layer
  starts.insert(starts.end(), boundaries.begin(), boundaries.end());
  auto size = [&](std::size_t s) { return (s + 1 < starts.size() ? starts[s + 1] : layers) - starts[s]; };
  while (static_cast<int>(starts.size()) > std::max(1, servers)) {
    std::size_t best = 0;  // merge stages best and best + 1
    for (std::size_t s = 1; s + 1 < starts.size(); ++s)
      if (size(s) + size(s + 1) < size(best) + size(best + 1)) best = s;
    starts.erase(starts.begin() + static_cast<std::ptrdiff_t>(best + 1));
  }
  return std::vector<int>(starts.begin() + 1, starts.end());
}

StatusOr<ServerFold> FoldOntoServers(const v1::JobSpec& spec, int servers) {
  CONVEYOR_ASSIGN_OR_RETURN(std::vector<LayerRange> ranges, PartitionLayers(spec));
  std::vector<int> boundaries;
  for (std::size_t c = 1; c < ranges.size(); ++c) boundaries.push_back(ranges[c].begin);
  const int layers = ranges.back().end;
  const int old_servers = spec.partition().stages();
  ServerFold fold;
  fold.spec = spec;
  v1::JobSpec& next = fold.spec;
  next.mutable_partition()->set_stages(servers);
  if (spec.schedule() == v1::SCHEDULE_INTERLEAVED &&
      MicroBatchCount(spec, spec.batch_size()) % servers != 0) {
    next.set_schedule(v1::SCHEDULE_1F1B);
    next.set_virtual_stages(1);
    fold.changed = "the interleaved schedule needs micro-batches a multiple of the stages (" +
                   std::to_string(servers) + "): it goes on as 1f1b, one chunk a stage server";
  }
  const int chunks = servers * std::max(1, next.virtual_stages());
  const std::vector<int> merged = MergeStages(boundaries, layers, chunks);
  next.mutable_partition()->clear_boundaries();
  for (int b : merged) next.mutable_partition()->add_boundaries(b);
  fold.cut = absl::StrJoin(merged, ", ");
  // A recomputed server's chunks are recomputed wherever their layers go:
  // old chunk c is in the new chunk whose first boundary is the last one at
  // or before c's first layer.
  std::set<int> recompute;
  for (int s : spec.recompute_stages()) {
    for (std::size_t c = 0; c < ranges.size(); ++c) {
      if (StageOfChunk(spec.schedule(), static_cast<int>(c), old_servers) != s) continue;
      const int chunk = static_cast<int>(std::upper_bound(merged.begin(), merged.end(), ranges[c].begin) - merged.begin());
      recompute.insert(StageOfChunk(next.schedule(), chunk, servers));
    }
  }
  next.clear_recompute_stages();
  for (int s : recompute) next.add_recompute_stages(s);
  if (Status st = ValidateJobSpec(next); !st.ok())
    return absl::FailedPreconditionError("the job cannot go on over " + std::to_string(servers) +
                                         " stage server(s): " + std::string(st.message()));
  return fold;
}

std::string TrainingDigest(v1::JobSpec spec) {
  spec.clear_partition();
  // Replicas split the same global batch: fewer of them sum it in another
  // order (the same to rounding).
  spec.clear_replicas();
  spec.clear_zero_stage();  // checkpoints hold the optimizer state whole, by parameter
  spec.clear_bucket_cap_mb();
  spec.clear_collectives();
  spec.clear_schedule();
  spec.clear_virtual_stages();
  spec.clear_recompute();
  spec.clear_recompute_stages();
  spec.clear_transport();
  spec.clear_nccl_ctas();
  spec.clear_nccl_headers();
  spec.clear_cuda_graphs();
  spec.clear_steps_in_flight();
  spec.clear_stage_timeout_s();
  spec.clear_recovery_timeout_s();
  spec.clear_checkpoint_every();
  spec.clear_keep_checkpoints();
  spec.clear_checkpoint_copies();
  spec.clear_on_lost_server();
  spec.clear_lost_after_s();
  spec.clear_commit_steps();
  spec.clear_profile_step();
  Sha256 sum;
  sum.Update(spec.SerializeAsString());
  return HexString(sum.Final());
}

}  // namespace conveyor
