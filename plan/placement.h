// How `conveyor local` places a job's stages on one host's GPUs: one stage
// server per GPU. Two processes on one GPU take turns on it (the driver
// switches between their contexts), so a job whose stages outnumber the GPUs
// is folded: each server holds consecutive stages of the job as one. A
// pipeline's results do not depend on where it is cut (every pipelined run
// equals the reference), so the folded job trains to the same losses and
// weights. Torch-free.
//
// On two H100s the Quick start's job (4 stages) took 4.5 s an epoch as four
// processes, two on each GPU, and 2.3 s folded into two (bench/RESULTS.md).
//
// The same folds re-plan a job whose servers are lost for good (MergeStages,
// FoldOntoServers; docs/recovery.md), and TrainingDigest says which
// checkpoints a job may load under another layout.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "conveyor.pb.h"

namespace conveyor {

struct GpuFold {
  int stages = 0;  // the job's stages
  int folded = 0;  // its stages on the GPUs (== stages: not folded)
  // The job-key overrides (as `--set` takes them) that make the folded job:
  // partition.stages, partition.boundaries (every k-th boundary where the
  // job gives them) and recompute (stage indices divided by k).
  std::vector<std::string> sets;
  // Where the stages outnumber the GPUs and stay so: why (else empty).
  std::string why_not;
};

// The fold of `spec` onto `gpus` GPUs: the largest number of stages that
// gives each of its replicas' stages a GPU of its own. The job keeps its
// stages where they fit, where there are more replicas than GPUs, for the
// interleaved schedule (its chunks are placed on the job's stages), and where
// boundaries or per-stage keys are given that the GPUs do not divide.
GpuFold FoldOntoGpus(const v1::JobSpec& spec, int gpus);

// A job cut at `boundaries` (the first layer of each stage after the first)
// over `layers` layers, folded onto `servers` servers when it lost some: the
// two adjacent stages with the fewest layers together become one, until
// `servers` stages are left. Each new stage holds whole stages of the old
// cut, so it computes what they computed (the same losses and weights), and
// the boundaries returned are some of the old ones. REQUIRES servers >= 1.
std::vector<int> MergeStages(const std::vector<int>& boundaries, int layers, int servers);

// A one-replica job laid out anew over `servers` of its stage servers, the
// others lost for good: its chunks merged as MergeStages does (V chunks a
// server stay V chunks a server, for the interleaved and zbv schedules), and
// its per-stage keys (recompute) moved with their layers. An interleaved job
// whose micro-batches are no multiple of the servers left goes on as 1F1B
// (one chunk a server). Every new chunk holds whole chunks of the old cut:
// the same arithmetic where the schedule is kept.
struct ServerFold {
  v1::JobSpec spec;     // the job over `servers`
  std::string cut;      // its boundaries, "6, 9"
  std::string changed;  // what else changed, for the job's events ("" where nothing)
};
StatusOr<ServerFold> FoldOntoServers(const v1::JobSpec& spec, int servers);

// The SHA-256 (hex) of what decides a job's arithmetic apart from how it is
// laid out on servers: the spec without its partition, replicas (which split
// one global batch), zero, schedule, virtual stages, recomputation, transports,
// collectives, and checkpoint, recovery and timeout keys. A checkpoint is loaded under another partition (resharded) where its
// training digest is the job's.
std::string TrainingDigest(v1::JobSpec spec);

}  // namespace conveyor
