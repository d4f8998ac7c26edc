// The inside of a Stage (stage.h), shared by the files that implement it:
//   stage.cpp          the facade, and the control operations (probe, describe,
//                      profile, configure, links, release, abort, info)
//   step_runner.cpp    one step's action loop: forward, backward, weight and
//                      recompute passes, sends and receives, the device wait
//   step_update.cpp    after the passes: the replicas' gradient all-reduce,
//                      the gradient norm's shares, the optimizer step, ZeRO-1's
//                      shards, the step's checkpoint
//   stage_state.cpp    checkpoints (serialise, restore), digests, parameters
// Private to stage_server/: nothing outside includes it.
#pragma once

#include "stage_server/stage.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include "model/compat.h"
#include "model/dataset.h"
#include "model/device.h"
#include "common/clock.h"
#include "common/executor.h"
#include "common/files.h"
#include "common/sha256.h"
#include "plan/job_spec.h"
#include "plan/lr_schedule.h"
#include "common/logging.h"
#include "plan/model_catalog.h"
#include "model/models.h"
#include "model/op_profile.h"
#include "transport/tensor_codec.h"
#include "model/optimizer.h"
#include "model/training.h"
#include "model/partition.h"
#include "model/state_dict.h"
#include "model/torchscript_partition.h"
#include "model/zoo_partition.h"
#include "common/wire.h"
#include "stage_server/checkpoint.h"
#include "stage_server/device_clock.h"
#include "stage_server/device_info.h"
#include "stage_server/flat_views.h"
#include "stage_server/graphed_passes.h"
#include "stage_server/gradient_reducer.h"
#include "stage_server/replica_group.h"
#include "stage_server/split_backward.h"
#include "transport/inbox.h"
#include "transport/loopback_transport.h"
#include "plan/schedule.h"
#include "transport/tensor_payload.h"

namespace conveyor {
namespace stage_internal {
using SteadyClock = std::chrono::steady_clock;

// The fields of a parameter's optimizer state (ParameterState in model/optimizer.h).
constexpr const char* kOptimizerFields[] = {"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer"};

inline std::vector<int64_t> ToVector(at::IntArrayRef a) { return std::vector<int64_t>(a.begin(), a.end()); }

inline int64_t NowUs() { return UnixMicros(); }

inline int64_t Bytes(const at::Tensor& t) { return t.defined() ? t.numel() * t.element_size() : 0; }
inline int64_t Bytes(const Tensors& ts) {
  int64_t n = 0;
  for (const at::Tensor& t : ts) n += Bytes(t);
  return n;
}


// What a chunk takes in: the model's input (tokens for gpt) or activations.
inline at::ScalarType ChunkInputType(const v1::JobSpec& spec, int chunk) {
  return FromWireDType(chunk == 0 ? InputDType(spec) : ActivationDType(spec));
}

// The indices of `specs` that exchange gradients (all with `all`).
inline std::vector<int> PartsOf(const std::vector<v1::SampleSpec>& specs, bool all) {
  std::vector<int> parts;
  for (int i = 0; i < static_cast<int>(specs.size()); ++i)
    if (all || specs[static_cast<std::size_t>(i)].requires_grad()) parts.push_back(i);
  return parts;
}

// One chunk's micro-batch, from its forward until its backward (or, with
// zero-bubble, its weight pass) is done.
struct Held {
  Tensors inputs;   // those that take a gradient require grad (never the model's input)
  Tensors outputs;  // the activations sent on, or {the scaled loss}; empty while recomputing
                    // and after an input-gradient-only backward
  std::shared_ptr<SplitBackward> split;  // zero-bubble: what the weight pass starts from
  at::Tensor labels;  // last chunk with recompute: to rebuild the loss
  double scale = 1;
  int64_t bytes = 0;
};
// A compute action timed on the device: its timeline event and its two marks.
struct DeviceSpan {
  int event, start_mark, end_mark;
};
}  // namespace stage_internal

using namespace stage_internal;  // NOLINT: the implementation files' own helpers

class Stage::Impl {
 public:
  Impl(const StageOptions& options, at::Device device)
      : options_(options),
        device_(device),
        gpu_uuid_(device.is_cuda() ? CudaDeviceUuid(device.str()) : ""),
        checkpoints_(options.checkpoint_dir),
        clock_(DeviceClock::Create(device)) {
    inbox_.SetClock(options.clock);
  }
  // The time stage_timeout is judged by (StageOptions.clock, else the steady clock).
  SteadyClock::time_point Now() const { return options_.clock ? options_.clock->Now() : SteadyClock::now(); }

  // The logic of each operation of proto/stage_control_ops.h (a kLaunch
  // one's is a pair, Launch<Name> and Finish<Name>, declared below).
#define CONVEYOR_STAGE_LOGIC_kExecutor(Name, Request, Reply) StatusOr<Reply> Name(const Request& request);
#define CONVEYOR_STAGE_LOGIC_kAnyThread(Name, Request, Reply) StatusOr<Reply> Name(const Request& request);
#define CONVEYOR_STAGE_LOGIC_kLaunch(Name, Request, Reply)
#define CONVEYOR_STAGE_LOGIC(Name, Request, Reply, Thread, How) CONVEYOR_STAGE_LOGIC_##Thread(Name, Request, Reply)
  CONVEYOR_STAGE_CONTROL_OPS(CONVEYOR_STAGE_LOGIC)
#undef CONVEYOR_STAGE_LOGIC
#undef CONVEYOR_STAGE_LOGIC_kLaunch
#undef CONVEYOR_STAGE_LOGIC_kAnyThread
#undef CONVEYOR_STAGE_LOGIC_kExecutor
  v1::StageInfo Info() const;

  // A training step that LaunchRunStep queued on the device and left to
  // FinishRunStep, which waits for it on the calling thread while the
  // executor launches the next step: what its reply still needs.
  struct StepEnd {
    v1::RunStepReply reply;  // whole unless `waiting`
    bool waiting = false;    // FinishRunStep still waits for the device and reads the figures
    std::string who;         // Who() at launch
    int64_t step = 0;
    std::unique_ptr<c10::Event> done;  // on a GPU: recorded after the step's last work
    at::Tensor figures;                // [loss_sum, grad_sq_norm] in host memory, once `done` passed
    std::shared_ptr<DeviceClock::Marks> marks;
    std::vector<DeviceSpan> device_spans;
    double host_busy = 0;                  // busy seconds timed on the host
    std::shared_ptr<Transport> transport;  // watched while waiting
    std::function<Status(const Status&)> collectives;  // the replicas' (ReplicaGroup::Watcher), watched too
    SteadyClock::time_point start;         // when the step began on this stage
    SteadyClock::duration timeout;         // stage_timeout: the device's progress is awaited this long
  };
  // RunStep is these two: the launch on the executor, the end on the caller's
  // thread (proto/stage_control_ops.h, kLaunch). A step that writes a
  // checkpoint, is profiled, or waits for the coordinator's ApplyStep ends on
  // the executor (its StepEnd is whole).
  StatusOr<StepEnd> LaunchRunStep(const v1::RunStepRequest& req);
  StatusOr<v1::RunStepReply> FinishRunStep(StepEnd end);
  // Waits (on the caller's thread) until training step req.step() is the
  // next one this stage launches, or the step before it has begun: two steps
  // sent at once (coordinator/job_runner.cpp) may arrive in either order.
  Status AwaitTurn(const v1::RunStepRequest& req);

  SerialExecutor& executor() { return executor_; }
  Inbox& inbox() { return inbox_; }
  // Closes the job's links (its streams to the neighbours), once the
  // executor has stopped: their servers need not wait out their grace period.
  void CloseLinks() {
    if (job_ && job_->transport) job_->transport->Shutdown();
  }

 private:
  struct Chunk {
    int index = 0;  // in the model's chain of chunks
    std::unique_ptr<Partition> layers;
    // What crosses in and out (a tuple's tensors, in order); `requires_grad`
    // ones exchange gradients with the neighbour.
    std::vector<v1::SampleSpec> inputs, outputs;
    std::vector<at::Tensor> params;  // the trainable ones (frozen parameters get no gradient and no update)
  };
  // Everything of the configured job; touched on the executor thread only.
  struct Job {
    v1::StageAssignment assignment;
    std::vector<Chunk> chunks;  // local chunk i holds model chunk ModelChunk(schedule, stage, i, P)
    std::unique_ptr<torch::optim::Optimizer> optimizer;
    std::unique_ptr<Dataset> data;
    std::unique_ptr<BatchLoader> loader;  // over `data`
    std::shared_ptr<Transport> transport;  // shared with the end of a step in flight (StepEnd)
    // zbv: the turn of the V on the last stage, its chunk P-1 feeding its chunk P.
    std::unique_ptr<LoopbackTransport> turn_link;
    v1::LinkSetup downstream_link;  // made by PrepareLink
    std::shared_ptr<PreparedLink> prepared_link;  // made by PrepareLink, then the transport's
    bool recompute = false;
    std::unique_ptr<GraphedPasses> graphs;  // cuda_graphs, on a CUDA device
    bool trained_eagerly = false;           // a training step ran without graphs
    bool graphs_recorded = false;
    int64_t pending_step = -1;  // a step run with defer_update whose optimizer step waits for ApplyStep
    // commit_steps (every update deferred to ApplyStep): the optimizer steps
    // the state holds (-1 while one is applied), and what a training step
    // changes before its update (the CPU
    // generator, the buffers) as it stood when the step began: SaveState
    // takes back a step that was never applied.
    int64_t state_step = 0;
    int64_t begun_step = -1;  // the last training step whose passes began
    at::Tensor step_start_rng;
    std::vector<at::Tensor> step_start_buffers;
    // replicas: R > 1 (docs/parallelism.md): replica 0 serves the store of
    // its stage's group; every replica all-reduces through `replica_group`.
    std::unique_ptr<ReplicaStore> replica_store;
    std::unique_ptr<ReplicaGroup> replica_group;
    // Buckets the gradients for replica_group (destroyed before it);
    // chunk_params[k]: local chunk k's first parameter in its list, and the
    // count last.
    std::unique_ptr<GradientReducer> reducer;
    std::vector<std::size_t> chunk_params;
    // The buffers (BatchNorm's statistics) that replica 0 broadcasts after
    // each step, views of flat tensors (a buffer replaced since is
    // flattened again).
    FlatViews flat_buffers;
    // zero: 1 (ZeRO-1): the reducer reduce-scatters the gradients in slices
    // (sliced), and this replica's optimizer updates `updated`, the
    // parameters' elements in its slices (GradientReducer::SliceParameters,
    // at configure); the parameters are all-gathered after each update.
    // updated_params: each part's parameter, an index into param_names
    // (the trainable parameters' names, in the reducer's order).
    // whole_state: replica 0's copy of every parameter's optimizer state by
    // name, gathered from the replicas' parts for a checkpoint and dropped
    // once it is written.
    bool sliced = false;
    std::vector<at::Tensor> updated;
    std::vector<std::size_t> updated_params;
    std::vector<std::string> param_names;
    std::map<std::string, std::map<std::string, at::Tensor>> whole_state;
    const v1::JobSpec& spec() const { return assignment.spec(); }
    bool IsFirst(const Chunk& c) const { return c.index == 0; }
    bool IsLast(const Chunk& c) const { return c.index == assignment.num_chunks() - 1; }
  };

  // The state of one step in progress.
  struct StepState {
    const v1::RunStepRequest* req = nullptr;
    bool train = true;
    bool graphed = false;  // forwards and backwards replayed as CUDA graphs
    std::vector<int64_t> sizes, offsets;
    at::Tensor inputs, labels;
    SteadyClock::duration timeout;
    std::map<std::pair<int, int>, Held> held;  // (local chunk, micro-batch)
    int64_t held_bytes = 0, peak_count = 0, peak_bytes = 0;
    double busy = 0, loss_sum = 0;
    bool skipped = false;  // a loss or gradient that is not finite: no update
    int accumulate = 1;     // batches in this step (accumulate_steps; 1 in eval)
    int64_t data_step = 0;  // the batch being run: step * accumulate + k (frames carry it)
    at::Tensor loss_total;  // last chunk: the step's loss so far, on the device
    // Summed on the device: reading each micro-batch's loss would make the
    // host wait for the device, and the device then wait for launches.
    void AddLoss(const at::Tensor& loss) {
      at::Tensor l = loss.detach().to(at::kDouble);
      loss_total = loss_total.defined() ? loss_total + l : l;
    }
    // Read after the update (ReadsAfterUpdate): this stage's squared gradient
    // norm, on the device.
    at::Tensor sq;
    int64_t correct = 0, predictions = 0;
    v1::RunStepReply* reply = nullptr;
    std::shared_ptr<DeviceClock::Marks> marks;  // null: host times
    DeviceClock::Marks* clock = nullptr;        // marks.get()
    std::vector<DeviceSpan> device_spans;
  };


  // Records one action on the timeline; compute actions also count as busy.
  // With a device clock, compute actions are timed on the device (marks that
  // RunStep turns into times once the step's work is done).
  class Span {
   public:
    Span(StepState& st, v1::TraceEvent::Kind kind, int chunk, int mb)
        : st_(st), kind_(kind), chunk_(chunk), mb_(mb), start_(NowUs()),
          compute_(kind != v1::TraceEvent::SEND && kind != v1::TraceEvent::RECEIVE &&
                   kind != v1::TraceEvent::ALL_REDUCE) {
      if (compute_ && st_.clock) start_mark_ = st_.clock->Mark();
    }
    ~Span() {
      v1::TraceEvent* e = st_.reply->add_events();
      e->set_kind(kind_);
      e->set_chunk(chunk_);
      e->set_micro_batch(mb_);
      e->set_start_us(start_);
      e->set_end_us(NowUs());
      if (start_mark_ >= 0) {
        st_.device_spans.push_back({st_.reply->events_size() - 1, start_mark_, st_.clock->Mark()});
      } else if (compute_) {
        st_.busy += static_cast<double>(e->end_us() - e->start_us()) * 1e-6;
      }
    }

   private:
    StepState& st_;
    v1::TraceEvent::Kind kind_;
    int chunk_, mb_;
    int64_t start_;
    bool compute_;
    int start_mark_ = -1;
  };

  Status CheckJob(const std::string& job_id) const;
  // ABORTED unless `deployment` is the configuration this stage holds
  // (StageAssignment.deployment): `what` ("step 7") was sent to an earlier one.
  // REQUIRES: CheckJob passed.
  Status CheckDeployment(int64_t deployment, const std::string& what) const;
  // Configure, in its order: the assignment checked (`who` names the stage
  // in errors); one chunk built, initialised, moved to the device and probed;
  // the data and loss of the chunks that read them; CUDA graphs when they
  // apply; the optimizer over every parameter or this replica's slices; the
  // inbox told what frames to expect; the reply and the log lines.
  Status CheckAssignment(const v1::StageAssignment& a, const std::string& who) const;
  StatusOr<Chunk> ConfigureChunk(const Job& job, const v1::ChunkAssignment& ca, const std::string& who,
                                 const NamedTensors& init_from);
  Status OpenJobData(Job& job, const std::string& who);
  void ChooseGraphs(Job& job, const std::string& who);
  Status MakeJobOptimizer(Job& job, const NamedTensors& all_params, int64_t num_params, const std::string& who,
                          ParameterGroups* groups);
  void OpenInbox(const Job& job);
  v1::ConfigureReply ConfigureReplyFor(const Job& job, int64_t num_params) const;
  void LogConfigured(const Job& job, int64_t num_params, const ParameterGroups& groups, const std::string& who) const;
  // replicas: R > 1: serves (replica 0) or finds the store of this stage's
  // group, and makes the group that joins at the first all-reduce.
  Status JoinReplicas(Job& job);
  void DropJob();
  // Sizes matmuls to leave SMs to this stage's NCCL kernels, as the job's
  // matmul_sm_carveout says (auto: none without NCCL links).
  void ReserveSmsForNccl();
  // How many of this stage's links to its neighbours are NCCL ones.
  int NcclLinks() const;
  // The job's profile_step, when this is it and there is a folder for it.
  std::unique_ptr<OpProfile> MaybeStartProfile(const v1::RunStepRequest& req);
  // Whether this training step replays (or first records) CUDA graphs.
  bool UseGraphs(const v1::RunStepRequest& req) const;
  void FinishProfile(std::unique_ptr<OpProfile> profile, int64_t step);
  const std::string& ProfileDir() const {
    return options_.profile_dir.empty() ? options_.checkpoint_dir : options_.profile_dir;
  }
  // "stage S", or "stage S of replica R" where the job has replicas: how
  // errors and logs name this stage.
  static std::string Who(const v1::StageAssignment& a) {
    std::string who = "stage " + std::to_string(a.stage_index());
    if (a.num_replicas() > 1) who += " of replica " + std::to_string(a.replica());
    return who;
  }
  std::string Who() const { return job_ ? Who(job_->assignment) : "stage -1"; }
  // Every tensor of (kind, local chunk, mb): activations are the chunk's
  // inputs, gradients those of its outputs that require grad.
  StatusOr<Tensors> Receive(StepState& st, v1::FrameKind kind, int local, int mb);
  // `ts[k]` as part `parts[k]`, each a frame of its own.
  Status Send(StepState& st, v1::FrameKind kind, int to_chunk, int mb, const Tensors& ts, const std::vector<int>& parts);
  // The link and neighbour a frame for model chunk `to_chunk` leaves by.
  struct Route {
    Transport* link;
    Peer peer;
  };
  Route RouteTo(v1::FrameKind kind, int to_chunk) const;
  Status Forward(StepState& st, int local, int mb);
  // The chunk's layers over `x`, checked against what the probe found.
  StatusOr<Tensors> RunLayers(StepState& st, Chunk& c, int mb, const Tensors& x);
  // The last stage's loss as backward starts from it: times the step's loss
  // scale (RunStepRequest.loss_scale) when the job scales its loss.
  at::Tensor ScaledLoss(const StepState& st, const at::Tensor& loss) const;
  Status Backward(StepState& st, int local, int mb, bool input_grad_only);
  // Backward's parts: the forward again, with autograd, where recompute
  // dropped its outputs; the pass itself, from `h`'s outputs that require
  // grad (with `grads`, theirs, off the last chunk), returning the gradients
  // of the inputs `input_parts` (undefined where none reached them).
  Status RecomputeForward(StepState& st, int local, int mb, Held& h);
  StatusOr<Tensors> BackwardPass(StepState& st, int local, int mb, Held& h, const Tensors& grads,
                                 const std::vector<int>& input_parts, bool input_grad_only);
  Status WeightPass(StepState& st, int local, int mb);
  // Whether the frame `act` starts from is here (zero-bubble runs weight passes meanwhile).
  bool FrameReady(const Action& act) const;
  void Release(StepState& st, std::map<std::pair<int, int>, Held>::iterator it);
  // The inputs and labels of batch st.data_step, as this stage reads them.
  Status LoadBatch(StepState& st);
  Status RunActions(StepState& st);
  // LaunchRunStep, in its order: the request checked against the job; the
  // step begun (AwaitTurn's turn passed on, the inbox told, a deferred
  // update dropped); the step's state; its batches, then its figures (loss
  // sum, squared gradient norm): copied behind the step's work when it
  // ends off the executor (`detach`), else read once the device is done; the
  // reply, or for a detached step the StepEnd that FinishRunStep completes.
  Status CheckRunStep(const v1::RunStepRequest& req) const;
  Status BeginRunStep(const v1::RunStepRequest& req, int accumulate);
  void PrepareStepState(StepState& st, const v1::RunStepRequest& req, v1::RunStepReply* reply, int accumulate);
  // `profile` is the caller's, so that it outlives an exception out of here.
  Status RunStepBatches(StepState& st, StepEnd& end, std::unique_ptr<OpProfile>& profile, bool* detach);
  void ZeroStepGradients();
  // Whether this step ends off the executor (FinishRunStep) while the next one launches.
  bool DetachesStep(const StepState& st, bool profiled) const;
  void CopyStepFigures(StepState& st, StepEnd& end);
  void ReadStepFigures(StepState& st);
  StatusOr<StepEnd> EndRunStep(StepState& st, StepEnd& end, bool detach);
  // After the backward passes: lr, gradient norm share, the optimizer step.
  Status PrepareUpdate(StepState& st);
  // Writes the checkpoint of the state after `step` (0-based) was applied.
  StatusOr<v1::CheckpointRecord> CheckpointAfter(int64_t step);
  // ZeRO-1: each replica's updated parameters to the other copies.
  Status ShareShardedParameters();
  // What this stage's optimizer updates: every parameter, or its slices (zero 1).
  std::vector<at::Tensor> UpdatedParams() const;
  // zero 1: `sq`, this replica's slices' squared gradient norm, summed over
  // the replicas in place (defined then); nothing otherwise.
  Status SumOverSlices(at::Tensor& sq);
  // ZeRO-1: every parameter's optimizer state, whole, from the replicas'
  // parts to replica 0 (job_->whole_state).
  Status GatherOptimizerState();
  // replicas: sums the step's gradients over the copies of this stage (each
  // replica's losses are scaled by their share of the whole batch, so the
  // sum is the whole batch's gradient); just before the optimizer step.
  Status AllReduceGradients(StepState& st);
  // replicas: replica 0's buffers (BatchNorm's running statistics) to every
  // copy after the step, so that the copies stay equal.
  Status BroadcastBuffers();
  // Waits for the step's work on the device, watching the links meanwhile.
  Status FinishOnDevice(StepState& st);
  // Polls `done` until the device passes it; a broken link, a failed or late
  // collective of `collectives` (if given), an Abort, or no new mark passed
  // within `timeout` ends the wait with an error. Any thread; `beside`: beside
  // the executor, which launches the next step meanwhile.
  Status AwaitDevice(const c10::Event& done, Transport* transport, DeviceClock::Marks* marks,
                     SteadyClock::duration timeout, const std::string& who, int64_t step, bool beside,
                     const std::function<Status(const Status&)>& collectives = nullptr);
  // Whether this training step's optimizer step is launched before its loss
  // and gradient norm are read (on a GPU: PrepareUpdate).
  bool ReadsAfterUpdate(const v1::RunStepRequest& req) const;
  // Out of memory (stage_memory.cpp). What this stage holds, in words:
  // parameters, gradients, optimizer state, the step's activations (with
  // `st`), the caching allocator's reserve on a GPU.
  std::string MemoryHeld(const StepState* st) const;
  // Bytes of parameters, gradients and optimizer state, and on CUDA the
  // allocator's peak, into the step's reply (the job summary's memory).
  void ReportMemory(v1::RunStepReply* reply) const;
  // An exception caught where LibTorch is called, as a Status: a
  // StatusError's own status; RESOURCE_EXHAUSTED naming MemoryHeld and the
  // allocator's message for an allocation that failed; else `code`.
  Status TorchFailure(const std::exception& e, absl::StatusCode code, const std::string& context,
                      const StepState* st = nullptr) const;
  // After a failed step: drops its activations and empties the caching
  // allocator, so that the job holds only its parameters and optimizer state.
  void FreeStep(StepState& st);
  v1::CheckpointHeader CheckpointHeaderFor(int64_t step) const;
  // The job's parameters, buffers, optimizer state and CPU RNG as an archive.
  std::string SerializeState();
  Status RestoreState(const std::string& payload, const std::string& path);
  // replicas: the checkpoint of req.step(), read by replica 0 and sent to
  // every copy of this stage; replica 0's error on every copy.
  StatusOr<std::string> ReplicaCheckpoint(const v1::LoadCheckpointRequest& req, v1::CheckpointHeader* header,
                                          v1::CheckpointRecord* record);
  // Writes the state as the checkpoint of `step`, then its copy where the
  // assignment names a server for it and `copy` holds.
  StatusOr<v1::CheckpointRecord> SaveCheckpoint(int64_t step, bool copy = true);
  // commit_steps: keeps what a training step changes before its update
  // (KeepStepStart), and puts it back for a step never applied (TakeBackStep).
  void KeepStepStart();
  void TakeBackStep();
  // The optimizer's state from a checkpoint's archive: by parameter
  // (o<i>_<field>), or the optimizer's own archive in files written before.
  Status RestoreOptimizer(torch::serialize::InputArchive& archive, const std::string& path);
  // Every trainable parameter's optimizer state, by name, onto this stage's
  // optimizer: on the parameters, or (zero 1) on this replica's parts of
  // them. A parameter without state gets none.
  Status SetOptimizerState(std::map<std::string, std::map<std::string, at::Tensor>>& by_name);
  // LoadCheckpoint from this stage's own file (or, with replicas, replica 0's).
  StatusOr<v1::LoadCheckpointReply> LoadOwnCheckpoint(const v1::LoadCheckpointRequest& req);
  // Training goes on after the checkpoint of `step`, just loaded.
  void AfterLoad(int64_t step);
  // (resharding.cpp) LoadCheckpoint where this stage's layers were cut
  // otherwise when the checkpoint was written, or its file is on another
  // server: every parameter, buffer and optimizer state of its layers, by
  // name, from the files (or copies) of the stages that held them then,
  // read here or from req.peers.
  Status LoadResharded(const v1::LoadCheckpointRequest& req, v1::LoadCheckpointReply* reply);
  // This stage's checkpoint file of req's step: its own, else the copy it
  // keeps, else a peer's (req.peers: the file or copy of a lost server).
  StatusOr<std::string> FindCheckpoint(const v1::LoadCheckpointRequest& req, v1::CheckpointHeader* header,
                                       v1::CheckpointRecord* record);
  // (resharding.cpp) The checkpoint just written, sent to the server that
  // keeps its copy (assignment.checkpoint_copy_to).
  Status SendCopy(const v1::CheckpointRecord& record);

  const StageOptions options_;
  const at::Device device_;
  const std::string gpu_uuid_;  // "" off CUDA (StageInfo.gpu_uuid)
  CheckpointFiles checkpoints_;
  std::mutex copies_mu_;  // WriteCheckpointCopy: one part written at a time
  const std::unique_ptr<DeviceClock> clock_;  // null off CUDA
  SerialExecutor executor_;
  Inbox inbox_;
  std::unique_ptr<Job> job_;

  mutable std::mutex info_mu_;  // guards the fields below, read by Info() and Abort()
  std::string job_id_;
  int stage_index_ = -1;
  int replica_ = 0;
  int64_t deployment_ = 0;  // the job's configuration (StageAssignment.deployment)
  // Why the coordinator aborted the job's step (Abort), until the job is
  // dropped: a step that begins after it fails at its first wait.
  std::string aborted_;
  // The training step whose launch comes next (-1: any), and stage_timeout:
  // AwaitTurn. turn_cv_ is notified when either, or aborted_, changes.
  int64_t next_train_step_ = -1;
  double stage_timeout_s_ = 0;
  std::condition_variable turn_cv_;
  // Steps launched whose end is still awaited off the executor: while there
  // are any, the device is not idle when a step begins (DeviceClock::Begin).
  std::atomic<int> steps_in_flight_{0};
};

}  // namespace conveyor
