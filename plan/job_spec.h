// plan/: what a job is and how it is cut, without LibTorch: job files and
// their keys, schedules and the step simulator, what is known of a model
// without building it, placement on a host's GPUs. The coordinator and the CLI
// plan with it; ../model builds what it describes.
//
// Job files: YAML in, a validated conveyor::v1::JobSpec out.
//
// The parser rejects unknown keys and wrong types with a message that names the
// key ("optimizer.lr: expected a number, got 'fast'"), fills the documented
// defaults, then validates the whole spec once. Every error is
// INVALID_ARGUMENT. Torch-free, so the coordinator and the fuzz targets use it.
#pragma once

#include <algorithm>

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "conveyor.pb.h"

namespace conveyor {

// Defaults (see docs/jobs.md):
//   name: "job", partition: {stages: 1}, data: {name: synthetic,
//   train_samples: 1024, test_samples: 256}, batch_size: 32, micro_batches: 1,
//   schedule: gpipe, optimizer: {name: sgd, lr: 0.01}, adam betas [0.9, 0.999],
//   eps 1e-8, loss: cross_entropy, epochs: 1, eval: false, seed: 0,
//   stage_timeout: 10 (seconds), eval_batch_size: 1000, virtual_stages: 1,
//   recompute: false, checkpoint_every: 0 (never), keep_checkpoints: 3,
//   recovery_timeout: 120 (seconds; 0: fail at the first stage failure).
constexpr const char* kDefaultFashionMnistPath = "/usr/share/datasets/fashion-mnist";
// Debian's datasets: a data root of every server by default.
constexpr const char* kDatasetsRoot = "/usr/share/datasets";

// Steps left out of steady_samples_per_second (CUDA and allocator start-up).
constexpr int64_t kWarmupSteps = 2;
// recovery_timeout when the job file does not say: how long a failed stage,
// or a coordinator that `submit --wait` lost, is waited for.
constexpr double kDefaultRecoveryTimeoutS = 120;
// nccl_ctas when the job file does not say (see JobSpec.nccl_ctas).
constexpr int kDefaultNcclCtas = 2;

// The largest job file accepted.
constexpr std::size_t kMaxJobFileBytes = 1 << 20;

// INVALID_ARGUMENT naming the key for a bad file; also for text that is not
// UTF-8 (a binary file) or is empty.
StatusOr<v1::JobSpec> ParseJobYaml(const std::string& yaml_text);
// The text of a job file: NOT_FOUND when it does not exist, INVALID_ARGUMENT
// for a folder or a file over kMaxJobFileBytes.
StatusOr<std::string> ReadJobFile(const std::string& path);
StatusOr<v1::JobSpec> LoadJobFile(const std::string& path);

// The files a job names, checked on this host before it is queued: NOT_FOUND
// naming the key and the path; INVALID_ARGUMENT for a token file whose size
// is not a whole number of token ids. The coordinator checks them at submission (so
// it must see the same files as the stages that read them: see docs/jobs.md).
Status CheckJobFiles(const v1::JobSpec& spec);
// save.path, before a job is queued: not a folder, and the nearest folder of
// it that exists is one this host may write in (the missing ones are made
// when the weights are written). INVALID_ARGUMENT or PERMISSION_DENIED
// naming the path. Where the file is written: the coordinator at submission,
// `conveyor train` (the stages never write it).
Status CheckSavePath(const std::string& path);
// save.path once the job's stages are configured (status.stages() give
// their num_parameters): RESOURCE_EXHAUSTED, before any step, when the
// nearest folder of it that exists has less room than the weights take
// (parameters of replica 0 at the job's precision), naming both sizes. The
// room may still run out by the job's end: the writer's error then says so.
Status CheckSaveRoom(const v1::JobSpec& spec, const v1::JobStatus& status);

// data: {format: tokens}: bytes per token id of `dtype` (2 or 4; 0: none).
int TokenWidth(v1::TokenDType dtype);
// The samples in a token file of `bytes` bytes, for data.seq_len N and
// data.token_dtype: sample i is tokens[i*N : i*N+N], its target
// tokens[i*N+1 : i*N+N+1], so there are (tokens - 1) / N of them (the last
// window needs one token after it; a shorter tail is dropped).
// INVALID_ARGUMENT naming `key` and `path` when `bytes` is not a whole number
// of token ids.
StatusOr<int64_t> TokenSamples(const v1::DataSpec& data, const std::string& key, const std::string& path,
                               int64_t bytes);

// The paths a job names (model.torchscript, data.path, data.train,
// data.test, init_from, save.path), made absolute and confined to `roots`: a
// relative path is relative to the first root; with `..` and symbolic links
// resolved every path must lie under one of the roots (PERMISSION_DENIED
// naming the path and the roots; no roots: no confinement). NOT_FOUND for a
// file that must exist and does not. Then CheckJobFiles.
Status ResolveJobPaths(v1::JobSpec* spec, const std::vector<std::string>& roots);

// What stage 0 found in the job's files (DescribeJob in model/partition.h):
// the TorchScript model's layers and the data file's shapes, into the spec.
void ApplyDescription(const v1::DescribeReply& description, v1::JobSpec* spec);

// The servers' --data-root when none is given: the working folder and
// /usr/share/datasets (Debian's datasets).
std::vector<std::string> DefaultDataRoots();

// Checks the cross-field rules (batch vs micro-batches, stages vs layers...).
// ParseJobYaml calls it; servers call it again on specs that arrive typed.
Status ValidateJobSpec(const v1::JobSpec& spec);

std::string ScheduleName(v1::ScheduleKind kind);
// "grpc", "nccl", "inproc"; "" for none.
std::string LinkName(v1::LinkKind kind);
// Tokens in one sample (gpt models and token data), 0 otherwise: a job that
// counts tokens, whose eval loss is per token (its perplexity exp of it).
int64_t TokensPerSample(const v1::JobSpec& spec);
// "nccl", "gloo"; "" for none (one replica).
std::string CollectiveName(v1::CollectiveKind kind);
std::string ModelName(v1::ModelKind kind);
std::string JobStateName(v1::JobState state);
// Succeeded, failed or cancelled: the job will not change again.
bool IsTerminal(v1::JobState state);

// Copies of the pipeline (`replicas`, at least 1).
int Replicas(const v1::JobSpec& spec);
// Replica `replica`'s rows of a training batch of `batch` samples: the
// batch's contiguous `size` rows from `offset` (ValidateJobSpec refuses a
// batch_size that the replicas do not divide).
struct ReplicaShare {
  int64_t offset = 0, size = 0;
};
ReplicaShare ShareOf(const v1::JobSpec& spec, int64_t batch, int replica);

// Sizes of the micro-batches of one mini-batch of `batch` samples:
// micro_batches: M -> M near-equal parts (as torch.tensor_split; fewer when
// batch < M); split_size: S -> parts of S samples, the last one smaller.
std::vector<int64_t> MicroBatchSizes(const v1::JobSpec& spec, int64_t batch);
// MicroBatchSizes(spec, batch).size(), without building the list (a job file
// may ask for hundreds of thousands of one-sample micro-batches).
int64_t MicroBatchCount(const v1::JobSpec& spec, int64_t batch);

// The schedule's idle fraction of a step, for equal forward and backward
// costs per micro-batch: (P-1)/(M+P-1) for gpipe and 1f1b, (P-1)/(vM+P-1)
// interleaved, a third of 1f1b's for zero-bubble (ZB-H1).
double TheoreticalIdleFraction(const v1::JobSpec& spec);

// Batches per optimizer step (accumulate_steps; 1 when not given). Training
// step t reads batches tK .. tK+K-1 of the data, each one's loss weighted 1/K.
inline int AccumulateSteps(const v1::JobSpec& spec) { return spec.accumulate_steps() > 1 ? spec.accumulate_steps() : 1; }
// replicas: the largest bucket of gradients all-reduced at once, in MiB
// (bucket_cap_mb; 0: DDP's 25).
inline double BucketCapMb(const v1::JobSpec& spec) { return spec.bucket_cap_mb() > 0 ? spec.bucket_cap_mb() : 25.0; }
// Training steps the coordinator sends to the stages at once (steps_in_flight).
inline int StepsInFlight(const v1::JobSpec& spec) { return spec.steps_in_flight() > 0 ? spec.steps_in_flight() : 2; }
// on_lost_server: whether the job goes on over the servers left when one is
// lost for good, and after how many seconds without an answer it counts as
// lost (lost_after, at most recovery_timeout).
inline bool ReplansOnLostServer(const v1::JobSpec& spec) { return spec.on_lost_server() != v1::LOST_SERVER_FAIL; }
inline double LostAfterS(const v1::JobSpec& spec) {
  return spec.has_lost_after_s() ? std::min(spec.lost_after_s(), spec.recovery_timeout_s()) : spec.recovery_timeout_s();
}
// checkpoint_copies: copies of each checkpoint kept by another server (unset: 1).
inline int CheckpointCopies(const v1::JobSpec& spec) { return spec.has_checkpoint_copies() ? spec.checkpoint_copies() : 1; }

// Whether CUDA devices replay the job's passes as CUDA graphs (cuda_graphs),
// and why not where they don't. Given in the job: as given (ValidateJobSpec
// refused `true` where graphs cannot work). Left out (`auto`): on for the
// zoo's models wherever graphs can work and hold no more memory than the
// schedule already does: the reference (`reference`: one graph pair per
// batch, the activations an eager step holds), one stage, one micro-batch or
// gpipe (which holds every micro-batch's activations anyway); off for 1f1b and
// interleaved pipelines (a graph pair per micro-batch keeps its activations,
// where those schedules hold at most one per stage in flight), replicas of
// a pipeline of several stages (untried), TorchScript models (a
// user's module may not be capturable), mixed precision, loss scaling,
// recompute and zero-bubble. `why_off` names the reason, for the one
// line a job says.
struct GraphsChoice {
  bool on = false;
  std::string why_off;
};
GraphsChoice CudaGraphsFor(const v1::JobSpec& spec, bool reference);

// The thread blocks each NCCL communicator of a link gets: the job's
// nccl_ctas, except that NCCL's own choice (0) becomes kDefaultNcclCtas under
// cuda_graphs. A link runs two communicators at once (one each way) and
// NCCL's kernels wait on the device for their peers; with NCCL's own count
// beside graph replays, W1 over two H100s deadlocked at every step (each
// stage's receive waiting for a send the other GPU never ran), with 2 CTAs it
// trained (bench/RESULTS.md, "Two H100s", 2026-11-25).
inline int NcclCtas(const v1::JobSpec& spec) {
  return spec.nccl_ctas() == 0 && CudaGraphsFor(spec, false).on ? kDefaultNcclCtas : spec.nccl_ctas();
}

// Whether `stage` recomputes its forwards during backward.
bool RecomputeOn(const v1::JobSpec& spec, int stage);

// The report of the epoch that training step `done` (a multiple of
// `steps_per_epoch`) ended: its number and the mean of its steps' `losses`;
// `timed_steps` of them took `seconds` (0: not measured). No evaluation.
v1::EpochReport EpochSummary(const google::protobuf::RepeatedField<float>& losses, int64_t done,
                             int64_t steps_per_epoch, int64_t timed_steps, int64_t batch_size, double seconds);

}  // namespace conveyor
