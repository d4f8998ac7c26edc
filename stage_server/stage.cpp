#include "stage_server/stage.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include "model/compat.h"
#include "model/dataset.h"
#include "model/device.h"
#include "model/digest.h"
#include "common/executor.h"
#include "common/files.h"
#include "common/sha256.h"
#include "plan/job_spec.h"
#include "common/logging.h"
#include "plan/model_catalog.h"
#include "model/models.h"
#include "model/op_profile.h"
#include "transport/tensor_codec.h"
#include "model/training.h"
#include "model/partition.h"
#include "model/state_dict.h"
#include "model/torchscript_partition.h"
#include "model/zoo_partition.h"
#include "common/wire.h"
#include "stage_server/checkpoint.h"
#include "stage_server/device_clock.h"
#include "stage_server/graphed_passes.h"
#include "transport/nccl/header_ring.h"
#include "transport/inbox.h"
#include "transport/nccl/nccl_channel.h"
#include "plan/schedule.h"
#include "transport/tensor_payload.h"

namespace conveyor {
namespace {

using Clock = std::chrono::steady_clock;

std::vector<int64_t> ToVector(at::IntArrayRef a) { return std::vector<int64_t>(a.begin(), a.end()); }

int64_t NowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int64_t Bytes(const at::Tensor& t) { return t.defined() ? t.numel() * t.element_size() : 0; }


// Output shape of `layers` for one sample of `input`; c10::Error if they
// cannot take it.
StatusOr<std::vector<int64_t>> ProbeShape(Partition& layers, const std::vector<int64_t>& input, at::ScalarType dtype,
                                         const at::Device& device) {
  at::NoGradGuard no_grad;
  std::vector<int64_t> probe{1};
  probe.insert(probe.end(), input.begin(), input.end());
  // Eval mode: BatchNorm cannot train on one sample, and the probe must not
  // move its running statistics.
  const bool training = layers.is_training();
  layers.Train(false);
  auto out = layers.Forward(at::zeros(probe, at::TensorOptions().device(device).dtype(dtype)));
  layers.Train(training);
  if (!out.ok()) return out.status();
  std::vector<int64_t> shape = ToVector(out->sizes());
  shape.erase(shape.begin());
  return shape;
}

// What a chunk takes in: the model's input (tokens for gpt) or activations.
at::ScalarType ChunkInputType(const v1::JobSpec& spec, int chunk) {
  return FromWireDType(chunk == 0 ? InputDType(spec) : ActivationDType(spec));
}

Status CheckSampleShape(const google::protobuf::RepeatedField<int64_t>& shape, const std::string& who) {
  if (shape.empty() || shape.size() > 8) return absl::InvalidArgumentError(who + ": a sample shape needs 1 to 8 dimensions");
  for (int64_t d : shape)
    if (d <= 0 || d > (int64_t{1} << 31)) return absl::InvalidArgumentError(who + ": bad sample shape");
  return absl::OkStatus();
}

// One chunk's micro-batch, from its forward until its backward (or, with
// zero-bubble, its weight pass) is done.
struct Held {
  at::Tensor input;   // requires grad unless it is the model's input
  at::Tensor output;  // the activation sent on, or the scaled loss; undefined while recomputing
  at::Tensor grad;    // zero-bubble: the output gradient, kept for the weight pass
  at::Tensor labels;  // last chunk with recompute: to rebuild the loss
  double scale = 1;
  int64_t bytes = 0;
};

}  // namespace

class Stage::Impl {
 public:
  Impl(const StageOptions& options, at::Device device)
      : options_(options), device_(device), checkpoints_(options.checkpoint_dir), clock_(DeviceClock::Create(device)) {}

  StatusOr<v1::ProbeReply> Probe(const v1::ProbeRequest& req);
  StatusOr<v1::ProfileReply> Profile(const v1::ProfileRequest& req);
  StatusOr<v1::DescribeReply> Describe(const v1::JobSpec& spec);
  StatusOr<v1::ConfigureReply> Configure(const v1::StageAssignment& a);
  StatusOr<v1::LinkSetup> PrepareLink(const v1::JobRef& ref);
  StatusOr<v1::ConnectReply> Connect(const v1::JobRef& ref);
  StatusOr<v1::RunStepReply> RunStep(const v1::RunStepRequest& req);
  StatusOr<v1::DigestReply> GetDigest(const v1::JobRef& ref);
  StatusOr<v1::ParametersReply> GetParameters(const v1::JobRef& ref);
  StatusOr<v1::LoadCheckpointReply> LoadCheckpoint(const v1::LoadCheckpointRequest& req);
  Status Release(const v1::JobRef& ref);
  Status Abort(const v1::AbortRequest& req);
  v1::StageInfo Info() const;

  SerialExecutor& executor() { return executor_; }
  Inbox& inbox() { return inbox_; }

 private:
  struct Chunk {
    int index = 0;  // in the model's chain of chunks
    std::unique_ptr<Partition> layers;
    std::vector<int64_t> input_shape, output_shape;
    std::vector<at::Tensor> params;  // the trainable ones (frozen parameters get no gradient and no update)
  };
  // Everything of the configured job; touched on the executor thread only.
  struct Job {
    v1::StageAssignment assignment;
    std::vector<Chunk> chunks;  // local chunk i holds model chunk i * P + stage
    std::unique_ptr<torch::optim::Optimizer> optimizer;
    std::unique_ptr<Dataset> data;
    std::unique_ptr<BatchLoader> loader;  // over `data`
    std::unique_ptr<Transport> transport;
    v1::LinkSetup downstream_link;  // made by PrepareLink
    std::shared_ptr<LinkRings> downstream_rings;  // made by PrepareLink, then the transport's
    bool recompute = false;
    std::unique_ptr<GraphedPasses> graphs;  // cuda_graphs, on a CUDA device
    bool trained_eagerly = false;           // a training step ran without graphs
    bool graphs_recorded = false;
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
    Clock::duration timeout;
    std::map<std::pair<int, int>, Held> held;  // (local chunk, micro-batch)
    int64_t held_bytes = 0, peak_count = 0, peak_bytes = 0;
    double busy = 0, loss_sum = 0;
    at::Tensor loss_total;  // last chunk: the step's loss so far, on the device
    // Summed on the device: reading each micro-batch's loss would make the
    // host wait for the device, and the device then wait for launches.
    void AddLoss(const at::Tensor& loss) {
      at::Tensor l = loss.detach().to(at::kDouble);
      loss_total = loss_total.defined() ? loss_total + l : l;
    }
    int64_t correct = 0, predictions = 0;
    v1::RunStepReply* reply = nullptr;
    DeviceClock* clock = nullptr;  // null: host times
    int64_t origin_us = 0;         // host time of the clock's mark 0
    struct DeviceSpan {
      int event, start_mark, end_mark;
    };
    std::vector<DeviceSpan> device_spans;
  };

  // Records one action on the timeline; compute actions also count as busy.
  // With a device clock, compute actions are timed on the device (marks that
  // RunStep turns into times once the step's work is done).
  class Span {
   public:
    Span(StepState& st, v1::TraceEvent::Kind kind, int chunk, int mb)
        : st_(st), kind_(kind), chunk_(chunk), mb_(mb), start_(NowUs()),
          compute_(kind != v1::TraceEvent::SEND && kind != v1::TraceEvent::RECEIVE) {
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
  void DropJob();
  // Sizes matmuls to leave SMs to this stage's NCCL kernels, as the job's
  // matmul_sm_carveout says (auto: none without NCCL links).
  void ReserveSmsForNccl();
  // The job's profile_step, when this is it and there is a folder for it.
  std::unique_ptr<OpProfile> MaybeStartProfile(const v1::RunStepRequest& req);
  // Whether this training step replays (or first records) CUDA graphs.
  bool UseGraphs(const v1::RunStepRequest& req) const;
  void FinishProfile(std::unique_ptr<OpProfile> profile, int64_t step);
  const std::string& ProfileDir() const {
    return options_.profile_dir.empty() ? options_.checkpoint_dir : options_.profile_dir;
  }
  std::string Who() const { return "stage " + std::to_string(job_ ? job_->assignment.stage_index() : -1); }
  StatusOr<at::Tensor> Receive(StepState& st, v1::FrameKind kind, int local, int mb);
  Status Send(StepState& st, v1::FrameKind kind, int to_chunk, int mb, const at::Tensor& t);
  Status Forward(StepState& st, int local, int mb);
  Status Backward(StepState& st, int local, int mb, bool input_grad_only);
  Status WeightPass(StepState& st, int local, int mb);
  void Release(StepState& st, std::map<std::pair<int, int>, Held>::iterator it);
  Status RunActions(StepState& st);
  // Waits for the step's work on the device, watching the links meanwhile.
  Status FinishOnDevice(StepState& st);
  v1::CheckpointHeader CheckpointHeaderFor(int64_t step) const;
  // The job's parameters, buffers, optimizer state and CPU RNG as an archive.
  std::string SerializeState();
  Status RestoreState(const std::string& payload, const std::string& path);
  StatusOr<v1::CheckpointRecord> SaveCheckpoint(int64_t step);

  const StageOptions options_;
  const at::Device device_;
  CheckpointFiles checkpoints_;
  const std::unique_ptr<DeviceClock> clock_;  // null off CUDA
  SerialExecutor executor_;
  Inbox inbox_;
  std::unique_ptr<Job> job_;

  mutable std::mutex info_mu_;  // guards the two fields below, read by Info() and Abort()
  std::string job_id_;
  int stage_index_ = -1;
};

Status Stage::Impl::CheckJob(const std::string& job_id) const {
  if (!job_) return absl::FailedPreconditionError("this stage has no job configured (asked for '" + job_id + "')");
  if (job_->assignment.job_id() != job_id) {
    return absl::FailedPreconditionError("this stage runs job '" + job_->assignment.job_id() + "', not '" +
                                         job_id + "'");
  }
  return absl::OkStatus();
}

void Stage::Impl::ReserveSmsForNccl() {
  const v1::JobSpec& spec = job_->spec();
  int sms = spec.matmul_sm_carveout();
  if (sms < 0) {  // auto: what this stage's NCCL kernels may hold at once
    int links = 0;
    if (!job_->assignment.upstream().empty() && job_->transport->Name(Peer::kUpstream) == "nccl") ++links;
    if (!job_->assignment.downstream().empty() && job_->transport->Name(Peer::kDownstream) == "nccl") ++links;
    sms = spec.nccl_ctas() * 2 * links;  // a communicator each way per link
  }
  if (!SetMatmulSmCarveout(sms)) {
    LOG_WARN(Who(), ": this LibTorch cannot leave SMs to NCCL (matmul_sm_carveout ", sms, " ignored)");
  } else if (sms > 0) {
    LOG_INFO(Who(), ": matmuls leave ", sms, " SMs to the NCCL kernels");
  }
}

void Stage::Impl::DropJob() {
  SetMatmulSmCarveout(0);
  inbox_.Close();
  if (job_ && job_->transport) job_->transport->Shutdown();
  job_.reset();
  std::lock_guard<std::mutex> lock(info_mu_);
  job_id_.clear();
  stage_index_ = -1;
}

StatusOr<v1::ProbeReply> Stage::Impl::Probe(const v1::ProbeRequest& req) {
  CONVEYOR_RETURN_IF_ERROR(ValidateJobSpec(req.spec()));
  CONVEYOR_RETURN_IF_ERROR(CheckSampleShape(req.input_sample_shape(), "probe"));
  v1::JobSpec spec = req.spec();
  CONVEYOR_RETURN_IF_ERROR(ResolveJobPaths(&spec, options_.data_roots));
  CONVEYOR_ASSIGN_OR_RETURN(std::unique_ptr<Partition> layers,
                            BuildPartition(spec, req.layer_begin(), req.layer_end(), /*init=*/false));
  std::vector<int64_t> input(req.input_sample_shape().begin(), req.input_sample_shape().end());
  v1::ProbeReply reply;
  const std::string what = "layers [" + std::to_string(req.layer_begin()) + ", " + std::to_string(req.layer_end()) +
                           ") cannot take samples of shape " + ShapeString(input);
  try {
    // The chain's first layer is layer 0; any later one takes activations.
    at::ScalarType dtype = ChunkInputType(spec, req.layer_begin() == 0 ? 0 : 1);
    auto shape = ProbeShape(*layers, input, dtype, at::kCPU);
    if (!shape.ok()) return Annotate(shape.status(), what);
    for (int64_t d : *shape) reply.add_output_sample_shape(d);
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(what + ": " + e.what_without_backtrace());
  }
  return reply;
}

StatusOr<v1::DescribeReply> Stage::Impl::Describe(const v1::JobSpec& in) {
  v1::JobSpec spec = in;
  CONVEYOR_RETURN_IF_ERROR(ResolveJobPaths(&spec, options_.data_roots));
  return DescribeJob(spec);
}

StatusOr<v1::ProfileReply> Stage::Impl::Profile(const v1::ProfileRequest& req) {
  v1::JobSpec spec = req.spec();
  CONVEYOR_RETURN_IF_ERROR(ValidateJobSpec(spec));
  CONVEYOR_RETURN_IF_ERROR(ResolveJobPaths(&spec, options_.data_roots));
  const int64_t rows = MicroBatchSizes(spec, spec.batch_size()).front();
  std::vector<int64_t> shape{rows};
  for (int64_t d : InputSampleShape(spec)) shape.push_back(d);
  v1::ProfileReply reply;
  try {
    at::Tensor x = at::zeros(shape, at::TensorOptions().device(device_).dtype(FromWireDType(InputDType(spec))));
    std::vector<int64_t> label_shape{rows};
    for (int64_t d : LabelSampleShape(spec)) label_shape.push_back(d);
    const at::Tensor labels =
        at::zeros(label_shape, at::TensorOptions().device(device_).dtype(FromWireDType(LabelDType(spec))));
    const int layers = NumLayers(spec.model());
    if (req.time() && device_.is_cuda()) {
      // An idle GPU runs at a fraction of its clock until it has worked for a
      // while: without this the first layers timed look the costliest, and
      // the cut moved a W2 block off the stage that needed one.
      const at::Tensor a = at::ones({4096, 4096}, at::TensorOptions().device(device_).dtype(at::kBFloat16));
      const auto until = Clock::now() + std::chrono::milliseconds(500);
      while (Clock::now() < until) at::mm(a, a).sum().item<double>();
    }
    for (int i = 0; i < layers; ++i) {
      CONVEYOR_ASSIGN_OR_RETURN(std::unique_ptr<Partition> layer, BuildPartition(spec, i, i + 1, /*init=*/false));
      layer->To(device_);
      v1::LayerCost* cost = reply.add_layers();
      for (const auto& p : layer->Parameters()) cost->set_parameters(cost->parameters() + p.numel());
      at::Tensor out;
      auto run = [&] {  // forward and backward, waiting for the device at the end
        at::Tensor input = at::isFloatingType(x.scalar_type()) ? x.detach().requires_grad_(true) : x;
        out = ValueOrThrow(layer->Forward(input));
        if (i + 1 == layers) {
          // The last layer's stage also computes the loss (for a language
          // model, over logits as large as the vocabulary): it counts here.
          at::Tensor loss = ComputeLoss(spec, out, labels, 1.0);
          if (loss.requires_grad()) loss.backward();
        } else if (out.requires_grad()) {
          out.backward(at::ones_like(out));
        }
        return out.sum().item<double>();
      };
      if (req.time()) {
        run();  // warm-up: allocations, kernel selection
        std::vector<double> seconds;  // the median of 5: one hiccup moves no cut
        for (int r = 0; r < 5; ++r) {
          auto start = Clock::now();
          run();
          seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
        }
        std::nth_element(seconds.begin(), seconds.begin() + 2, seconds.end());
        cost->set_seconds(seconds[2]);
      } else {
        at::NoGradGuard no_grad;
        out = ValueOrThrow(layer->Forward(x));
      }
      x = out.detach();
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(std::string("profiling the model: ") + e.what_without_backtrace());
  } catch (const StatusError& e) {
    return Annotate(e.status(), "profiling the model");
  }
  return reply;
}

StatusOr<v1::ConfigureReply> Stage::Impl::Configure(const v1::StageAssignment& a) {
  const std::string who = "stage " + std::to_string(a.stage_index());
  if (a.job_id().empty()) return absl::InvalidArgumentError(who + ": job_id is empty");
  CONVEYOR_RETURN_IF_ERROR(Annotate(ValidateJobSpec(a.spec()), who));
  if (a.num_stages() < 1 || a.stage_index() < 0 || a.stage_index() >= a.num_stages()) {
    return absl::InvalidArgumentError(who + ": stage index out of range for " + std::to_string(a.num_stages()) +
                                      " stages");
  }
  if (a.chunks().empty() || a.num_chunks() < a.chunks_size() || a.num_chunks() > 4096)
    return absl::InvalidArgumentError(who + ": a stage needs 1 or more of the model's chunks");
  {
    // The coordinator resolved the job's paths under its roots; this stage
    // reads them only under its own.
    v1::JobSpec checked = a.spec();
    CONVEYOR_RETURN_IF_ERROR(ResolveJobPaths(&checked, options_.data_roots));
  }
  NamedTensors init_from;
  if (!a.spec().init_from().empty()) {
    CONVEYOR_ASSIGN_OR_RETURN(init_from, ReadStateDict(a.spec().init_from()));
    CONVEYOR_RETURN_IF_ERROR(CheckInitialWeightNames(a.spec(), init_from));
  }
  DropJob();

  auto job = std::make_unique<Job>();
  job->assignment = a;
  job->recompute = RecomputeOn(a.spec(), a.stage_index());
  bool reads_inputs = false, reads_labels = false;
  int64_t num_params = 0;
  std::vector<at::Tensor> all_params;
  for (const v1::ChunkAssignment& ca : a.chunks()) {
    const std::string what = who + " chunk " + std::to_string(ca.index());
    if (ca.index() < 0 || ca.index() >= a.num_chunks() || ca.index() % a.num_stages() != a.stage_index())
      return absl::InvalidArgumentError(what + ": not a chunk of this stage");
    CONVEYOR_RETURN_IF_ERROR(CheckSampleShape(ca.input_sample_shape(), what));
    Chunk c;
    c.index = ca.index();
    c.input_shape.assign(ca.input_sample_shape().begin(), ca.input_sample_shape().end());
    CONVEYOR_ASSIGN_OR_RETURN(c.layers, BuildPartition(a.spec(), ca.layer_begin(), ca.layer_end()));
    const std::string cannot = what + ": layers [" + std::to_string(ca.layer_begin()) + ", " +
                               std::to_string(ca.layer_end()) + ") cannot take samples of shape " +
                               ShapeString(c.input_shape);
    try {
      if (!init_from.empty()) CONVEYOR_RETURN_IF_ERROR(LoadInitialWeights(a.spec(), init_from, *c.layers));
      c.layers->To(device_);
      auto shape = ProbeShape(*c.layers, c.input_shape, ChunkInputType(a.spec(), c.index), device_);
      if (!shape.ok()) return Annotate(shape.status(), cannot);
      c.output_shape = *shape;
    } catch (const c10::Error& e) {
      return absl::InvalidArgumentError(cannot + ": " + e.what_without_backtrace());
    }
    std::vector<int64_t> promised(ca.output_sample_shape().begin(), ca.output_sample_shape().end());
    if (!promised.empty() && promised != c.output_shape) {
      return absl::InvalidArgumentError(what + ": outputs samples of shape " + ShapeString(c.output_shape) +
                                        ", the assignment says " + ShapeString(promised));
    }
    for (const auto& p : c.layers->Parameters()) {
      num_params += p.numel();
      if (p.requires_grad()) c.params.push_back(p);
    }
    all_params.insert(all_params.end(), c.params.begin(), c.params.end());
    reads_inputs |= job->IsFirst(c);
    reads_labels |= job->IsLast(c);
    job->chunks.push_back(std::move(c));
  }
  if (reads_inputs || reads_labels) {
    auto data = Dataset::Open(a.spec(), reads_inputs, reads_labels);
    if (!data.ok()) return Annotate(data.status(), who);
    job->data = std::move(*data);
    job->loader = std::make_unique<BatchLoader>(job->assignment.spec(), job->data.get(), device_, reads_inputs,
                                                reads_labels);
  }
  if (!all_params.empty()) job->optimizer = MakeOptimizer(a.spec().optimizer(), all_params);
  if (a.spec().cuda_graphs()) {
    if (GraphedPasses::Available(device_)) {
      job->graphs = std::make_unique<GraphedPasses>(device_);
    } else {
      LOG_INFO("job ", a.job_id(), " ", who, ": cuda_graphs ignored on ", device_.str());
    }
  }

  const v1::JobSpec& spec = a.spec();
  std::vector<int64_t> train_mbs = MicroBatchSizes(spec, spec.batch_size());
  std::vector<int64_t> eval_mbs = MicroBatchSizes(spec, spec.eval_batch_size());
  InboxExpectations expect;
  expect.job_id = a.job_id();
  expect.stage_index = a.stage_index();
  expect.num_stages = a.num_stages();
  expect.dtype = ActivationDType(spec);
  for (const Chunk& c : job->chunks) {
    if (!job->IsFirst(c)) expect.activation_shapes[c.index] = c.input_shape;
    if (!job->IsLast(c)) expect.gradient_shapes[c.index] = c.output_shape;
  }
  expect.max_micro_batches = static_cast<int>(std::max(train_mbs.size(), eval_mbs.size()));
  expect.max_micro_batch_size = std::max(train_mbs.front(), eval_mbs.front());
  inbox_.Open(std::move(expect));
  inbox_.SetSpin(device_.is_cuda() ? kGpuInboxSpin : std::chrono::microseconds(0));

  v1::ConfigureReply reply;
  for (int64_t d : job->chunks.back().output_shape) reply.add_output_sample_shape(d);
  reply.set_num_parameters(num_params);
  reply.set_device(device_.str());
  if (job->data) {
    reply.set_train_samples(job->data->train_size());
    reply.set_test_samples(job->data->test_size());
  }
  std::string ranges;
  for (const auto& ca : a.chunks())
    ranges += (ranges.empty() ? "" : ", ") + std::string("[") + std::to_string(ca.layer_begin()) + ", " +
              std::to_string(ca.layer_end()) + ")";
  LOG_INFO("job ", a.job_id(), " ", who, ": layers ", ranges, ", ", num_params, " parameters on ", device_.str(),
           job->recompute ? ", recomputing forwards" : "", job->graphs ? ", as CUDA graphs from the second step" : "");
  job_ = std::move(job);
  std::lock_guard<std::mutex> lock(info_mu_);
  job_id_ = a.job_id();
  stage_index_ = a.stage_index();
  return reply;
}

StatusOr<v1::LinkSetup> Stage::Impl::PrepareLink(const v1::JobRef& ref) {
  CONVEYOR_RETURN_IF_ERROR(CheckJob(ref.job_id()));
  if (job_->assignment.downstream().empty()) return absl::FailedPreconditionError(Who() + " has no downstream link");
  if (!device_.is_cuda() || !options_.transports->SupportsNccl()) {
    return absl::FailedPreconditionError(Who() + " on " + device_.str() + " cannot use NCCL" +
                                         (device_.is_cuda() ? " (not built with NCCL)" : " (not a CUDA device)"));
  }
  v1::LinkSetup link;
  link.set_transport(v1::TRANSPORT_NCCL);
  CONVEYOR_ASSIGN_OR_RETURN(*link.mutable_activation_nccl_id(), NewNcclUniqueId());
  CONVEYOR_ASSIGN_OR_RETURN(*link.mutable_gradient_nccl_id(), NewNcclUniqueId());
  job_->downstream_link = link;
  job_->downstream_rings.reset();
  if (!job_->spec().nccl_headers_on_grpc()) {
    // Made before the downstream stage hears of the link, so that one on
    // this host finds it when it connects (header_ring.h).
    auto rings = LinkRings::Create(LinkRings::NameFor(link.activation_nccl_id()));
    if (rings.ok()) {
      job_->downstream_rings = std::move(*rings);
    } else {
      LOG_INFO(Who(), ": NCCL frame headers stay on the gRPC stream: ", rings.status().message());
    }
  }
  return link;
}

StatusOr<v1::ConnectReply> Stage::Impl::Connect(const v1::JobRef& ref) {
  CONVEYOR_RETURN_IF_ERROR(CheckJob(ref.job_id()));
  v1::ConnectReply reply;
  if (job_->assignment.num_stages() == 1) {  // chunks pass tensors to themselves
    reply.set_transport("local");
    return reply;
  }
  if (job_->transport) job_->transport->Shutdown();
  auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(job_->spec().stage_timeout_s()));
  LinkOptions links;
  links.upstream = ref.upstream_link();
  links.downstream = job_->downstream_link;
  links.device = device_.str();
  links.inbox = &inbox_;
  links.timeout = std::chrono::duration<double>(job_->spec().stage_timeout_s());
  links.nccl_ctas = job_->spec().nccl_ctas();
  links.shm_headers = !job_->spec().nccl_headers_on_grpc();
  links.downstream_rings = std::move(job_->downstream_rings);
  auto transport = options_.transports->Connect(job_->assignment, links, deadline);
  if (!transport.ok()) return Annotate(transport.status(), Who());
  job_->transport = std::move(*transport);
  ReserveSmsForNccl();
  // The link this stage reports is the one to its next stage (the last stage: from its previous one).
  reply.set_transport(job_->transport->Name(job_->assignment.downstream().empty() ? Peer::kUpstream : Peer::kDownstream));
  return reply;
}

StatusOr<at::Tensor> Stage::Impl::Receive(StepState& st, v1::FrameKind kind, int local, int mb) {
  Span span(st, v1::TraceEvent::RECEIVE, local, mb);
  const int chunk = job_->chunks[local].index;
  CONVEYOR_ASSIGN_OR_RETURN(Frame frame, inbox_.Take(kind, chunk, mb, Clock::now() + st.timeout));
  if (frame.header.tensor().shape(0) != st.sizes[mb]) {
    return absl::InvalidArgumentError(Who() + " micro-batch " + std::to_string(mb) + ": " +
                                      (kind == v1::FRAME_ACTIVATION ? "activation" : "gradient") + " has " +
                                      std::to_string(frame.header.tensor().shape(0)) + " samples, expected " +
                                      std::to_string(st.sizes[mb]));
  }
  return TakeTensor(frame, device_);
}

Status Stage::Impl::Send(StepState& st, v1::FrameKind kind, int to_chunk, int mb, const at::Tensor& t) {
  const int from_chunk = kind == v1::FRAME_ACTIVATION ? to_chunk - 1 : to_chunk + 1;
  Span span(st, v1::TraceEvent::SEND, from_chunk / job_->assignment.num_stages(), mb);
  Frame frame;
  v1::TensorFrame& h = frame.header;
  h.set_job_id(st.req->job_id());
  h.set_phase(st.req->phase());
  h.set_step(st.req->step());
  h.set_micro_batch(mb);
  h.set_kind(kind);
  h.set_chunk(to_chunk);
  h.set_from_stage(job_->assignment.stage_index());
  CONVEYOR_ASSIGN_OR_RETURN(v1::DType dtype, ToWireDType(t.scalar_type()));
  h.mutable_tensor()->set_dtype(dtype);
  for (int64_t d : t.sizes()) h.mutable_tensor()->add_shape(d);
  frame.payload = MakeTensorPayload(t);
  if (job_->assignment.num_stages() == 1) {  // to its own next chunk: a copy, as a neighbour would get
    frame.payload = CopyPayload(*frame.payload);
    return inbox_.Deliver(std::move(frame));
  }
  const Peer peer = kind == v1::FRAME_ACTIVATION ? Peer::kDownstream : Peer::kUpstream;
  return Annotate(job_->transport->Send(peer, std::move(frame)), Who());
}

Status Stage::Impl::Forward(StepState& st, int local, int mb) {
  Chunk& c = job_->chunks[local];
  const bool first = job_->IsFirst(c), last = job_->IsLast(c);
  const int64_t rows = st.sizes[mb];
  at::Tensor x;
  if (first) {
    x = st.inputs.narrow(0, st.offsets[mb], rows);
  } else {
    CONVEYOR_ASSIGN_OR_RETURN(x, Receive(st, v1::FRAME_ACTIVATION, local, mb));
    if (st.train) x.requires_grad_(true);
  }
  Held h;
  h.input = x;
  h.scale = static_cast<double>(rows) / static_cast<double>(st.req->batch_size());
  at::Tensor out;
  if (st.graphed) {
    Span span(st, v1::TraceEvent::FORWARD, local, mb);
    GraphedPasses::Head head;
    at::Tensor labels;
    if (last) {
      labels = st.labels.narrow(0, st.offsets[mb], rows);
      const double scale = h.scale;
      head = [this, scale](const at::Tensor& o, const at::Tensor& l) { return ComputeLoss(job_->spec(), o, l, scale); };
    }
    auto f = job_->graphs->Forward(local, mb, *c.layers, x, !first, labels, head);
    if (!f.ok()) return Annotate(f.status(), Who());
    h.input = f->input;
    h.output = f->output;
    if (last) {
      st.AddLoss(f->output);
    } else {
      out = f->output;
    }
  } else {
    Span span(st, v1::TraceEvent::FORWARD, local, mb);
    // Recomputing stages keep only the chunk's input; the forward runs again in backward.
    std::optional<at::NoGradGuard> no_grad;
    if (job_->recompute && st.train) no_grad.emplace();
    CONVEYOR_ASSIGN_OR_RETURN(out, c.layers->Forward(x));
    if (last) {
      h.labels = st.labels.narrow(0, st.offsets[mb], rows);
      at::Tensor loss = ComputeLoss(job_->spec(), out, h.labels, h.scale);
      st.AddLoss(loss);
      if (!st.train) {
        st.correct += CountCorrect(out, h.labels);
        st.predictions += h.labels.numel();
      }
      if (!job_->recompute) h.output = loss;
    } else if (!job_->recompute) {
      h.output = out;
    }
  }
  if (!last) CONVEYOR_RETURN_IF_ERROR(Send(st, v1::FRAME_ACTIVATION, c.index + 1, mb, out));
  if (st.train) {
    h.bytes = Bytes(h.input) + Bytes(h.output);
    st.held_bytes += h.bytes;
    st.held.emplace(std::make_pair(local, mb), std::move(h));
    st.peak_count = std::max<int64_t>(st.peak_count, static_cast<int64_t>(st.held.size()));
    st.peak_bytes = std::max(st.peak_bytes, st.held_bytes);
  }
  return absl::OkStatus();
}

void Stage::Impl::Release(StepState& st, std::map<std::pair<int, int>, Held>::iterator it) {
  st.held_bytes -= it->second.bytes;
  st.held.erase(it);
}

Status Stage::Impl::Backward(StepState& st, int local, int mb, bool input_grad_only) {
  Chunk& c = job_->chunks[local];
  const bool first = job_->IsFirst(c), last = job_->IsLast(c);
  auto it = st.held.find({local, mb});
  if (it == st.held.end())
    return absl::InternalError(Who() + ": backward before forward of micro-batch " + std::to_string(mb));
  Held& h = it->second;
  at::Tensor grad;
  if (!last) {
    CONVEYOR_ASSIGN_OR_RETURN(grad, Receive(st, v1::FRAME_GRADIENT, local, mb));
  }
  if (!h.output.defined()) {  // recompute the forward, this time with autograd
    Span span(st, v1::TraceEvent::RECOMPUTE, local, mb);
    CONVEYOR_ASSIGN_OR_RETURN(at::Tensor out, c.layers->Forward(h.input));
    h.output = last ? ComputeLoss(job_->spec(), out, h.labels, h.scale) : out;
  }
  at::Tensor input_grad;
  {
    Span span(st, v1::TraceEvent::BACKWARD, local, mb);
    if (h.output.requires_grad() && st.graphed) {
      auto g = job_->graphs->Backward(local, mb, grad, c.params);
      if (!g.ok()) return Annotate(g.status(), Who());
      input_grad = *g;
    } else if (h.output.requires_grad()) {
      std::vector<at::Tensor> grads;
      if (grad.defined()) grads.push_back(grad);
      if (input_grad_only) {
        // Zero-bubble: the input gradient now, the weights' in WeightPass.
        h.grad = grad;
        if (!first) input_grad = torch::autograd::grad({h.output}, {h.input}, grads, /*retain_graph=*/true)[0];
      } else {
        torch::autograd::backward({h.output}, grads);
        if (!first) input_grad = h.input.grad();
      }
    }
  }
  if (!first) {
    if (!input_grad.defined()) input_grad = at::zeros_like(h.input);
    CONVEYOR_RETURN_IF_ERROR(Send(st, v1::FRAME_GRADIENT, c.index - 1, mb, input_grad));
  }
  if (input_grad_only) {
    st.held_bytes += Bytes(h.grad);
    h.bytes += Bytes(h.grad);
    st.peak_bytes = std::max(st.peak_bytes, st.held_bytes);
  } else {
    Release(st, it);
  }
  return absl::OkStatus();
}

Status Stage::Impl::WeightPass(StepState& st, int local, int mb) {
  auto it = st.held.find({local, mb});
  if (it == st.held.end())
    return absl::InternalError(Who() + ": weight pass without backward of micro-batch " + std::to_string(mb));
  Held& h = it->second;
  {
    Span span(st, v1::TraceEvent::WEIGHT, local, mb);
    std::vector<at::Tensor> params;
    for (const auto& p : job_->chunks[local].params)
      if (p.requires_grad()) params.push_back(p);
    if (h.output.requires_grad() && !params.empty()) {
      std::vector<at::Tensor> grads;
      if (h.grad.defined()) grads.push_back(h.grad);
      torch::autograd::backward({h.output}, grads, /*retain_graph=*/false, /*create_graph=*/false, params);
    }
  }
  Release(st, it);
  return absl::OkStatus();
}

Status Stage::Impl::RunActions(StepState& st) {
  const v1::JobSpec& spec = job_->spec();
  const v1::StageAssignment& a = job_->assignment;
  const int m = static_cast<int>(st.sizes.size());
  const int local_chunks = static_cast<int>(job_->chunks.size());
  std::vector<Action> actions;
  if (st.train) {
    CONVEYOR_ASSIGN_OR_RETURN(actions, BuildSchedule(spec.schedule(), a.stage_index(), a.num_stages(), m, local_chunks));
  } else {
    actions = ForwardOnly(m, local_chunks);
  }
  const bool zero_bubble = st.train && spec.schedule() == v1::SCHEDULE_ZERO_BUBBLE;
  std::string doing;
  try {
    for (const Action& act : actions) {
      doing = std::string(act.type == ActionType::kForward ? "forward" : act.type == ActionType::kBackward ? "backward" : "weight pass") +
              " of micro-batch " + std::to_string(act.micro_batch);
      switch (act.type) {
        case ActionType::kForward: CONVEYOR_RETURN_IF_ERROR(Forward(st, act.chunk, act.micro_batch)); break;
        case ActionType::kBackward: CONVEYOR_RETURN_IF_ERROR(Backward(st, act.chunk, act.micro_batch, zero_bubble)); break;
        case ActionType::kWeight: CONVEYOR_RETURN_IF_ERROR(WeightPass(st, act.chunk, act.micro_batch)); break;
      }
    }
    if (st.train && job_->optimizer) {
      doing = "optimizer step";
      Span span(st, v1::TraceEvent::OPTIMIZER, 0, -1);
      job_->optimizer->step();
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(Who() + " step " + std::to_string(st.req->step()) + ", " + doing + ": " +
                               e.what_without_backtrace());
  }
  return absl::OkStatus();
}

Status Stage::Impl::FinishOnDevice(StepState& st) {
  // The device may wait for NCCL transfers that a broken link never ends:
  // the host polls instead of blocking, so that it sees the link break (and
  // the transfers end, aborted) rather than hang in a synchronize.
  if (device_.is_cuda()) {
    c10::Event done(device_.type());
    done.record(c10::impl::VirtualGuardImpl(device_.type()).getStream(device_));
    // The host may have queued the whole step: stage_timeout bounds the wait
    // for the device's next action, not for all of them.
    auto last_progress = Clock::now();
    int passed = 0;
    for (int spins = 0; !done.query(); ++spins) {
      if (job_->transport) CONVEYOR_RETURN_IF_ERROR(Annotate(job_->transport->status(), Who()));
      const int now_passed = st.clock ? st.clock->Passed() : 0;
      if (now_passed > passed) {
        passed = now_passed;
        last_progress = Clock::now();
      }
      if (Clock::now() - last_progress > st.timeout)
        return absl::DeadlineExceededError(Who() + ": the device made no progress on step " +
                                           std::to_string(st.req->step()) + " within stage_timeout");
      if (spins < 1000) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
  }
  // A transfer that ended because its link broke ended early: check again.
  if (job_->transport) return Annotate(job_->transport->status(), Who());
  return absl::OkStatus();
}

bool Stage::Impl::UseGraphs(const v1::RunStepRequest& req) const {
  if (!job_->graphs || req.batch_size() != job_->spec().batch_size()) return false;
  // One step first runs as it is (lazy initialisation, kernel choices, the
  // allocator's pools), and a profiled step is not the one that records.
  if (job_->graphs_recorded) return true;
  return job_->trained_eagerly && job_->spec().profile_step() != req.step() + 1;
}

std::unique_ptr<OpProfile> Stage::Impl::MaybeStartProfile(const v1::RunStepRequest& req) {
  if (req.phase() != v1::PHASE_TRAIN || job_->spec().profile_step() != req.step() + 1) return nullptr;
  if (ProfileDir().empty()) {
    LOG_WARN("job ", req.job_id(), " ", Who(), ": profile_step ", req.step() + 1,
             " asked, but this stage server has neither --profile-dir nor --checkpoint-dir: not profiled");
    return nullptr;
  }
  auto profile = OpProfile::Start(device_.is_cuda());
  if (!profile.ok()) {
    LOG_WARN("job ", req.job_id(), " ", Who(), ": not profiled: ", profile.status().message());
    return nullptr;
  }
  return std::move(*profile);
}

// A profile is a diagnosis: failing to write it is logged, and the step goes on.
void Stage::Impl::FinishProfile(std::unique_ptr<OpProfile> profile, int64_t step) {
  const std::string path = ProfilePath(ProfileDir(), job_->assignment.job_id(), step,
                                       "stage" + std::to_string(job_->assignment.stage_index()));
  Status st = profile->Finish(path);
  if (st.ok()) {
    LOG_INFO("job ", job_->assignment.job_id(), " ", Who(), ": profile of step ", step, " written to ", path);
  } else {
    LOG_WARN("job ", job_->assignment.job_id(), " ", Who(), ": ", st.message());
  }
}

StatusOr<v1::RunStepReply> Stage::Impl::RunStep(const v1::RunStepRequest& req) {
  CONVEYOR_RETURN_IF_ERROR(CheckJob(req.job_id()));
  const v1::JobSpec& spec = job_->spec();
  if (req.phase() != v1::PHASE_TRAIN && req.phase() != v1::PHASE_EVAL)
    return absl::InvalidArgumentError(Who() + ": step without a phase");
  if (req.phase() == v1::PHASE_EVAL && !spec.eval())
    return absl::InvalidArgumentError(Who() + ": this job does not evaluate");
  const int64_t max_batch = req.phase() == v1::PHASE_TRAIN ? spec.batch_size() : spec.eval_batch_size();
  if (req.batch_size() < 1 || req.batch_size() > max_batch)
    return absl::InvalidArgumentError(Who() + ": batch_size " + std::to_string(req.batch_size()) +
                                      " is out of range [1, " + std::to_string(max_batch) + "]");
  if (req.step() < 0) return absl::InvalidArgumentError(Who() + ": negative step");
  if (job_->data && req.phase() == v1::PHASE_EVAL && req.step() >= job_->data->EvalBatches())
    return absl::InvalidArgumentError(Who() + ": eval batch " + std::to_string(req.step()) + " is past the test split");
  if (!job_->transport && job_->assignment.num_stages() > 1)
    return absl::FailedPreconditionError(Who() + ": not connected to its neighbours (call Connect first)");

  inbox_.BeginStep(req.phase(), req.step());
  if (job_->transport) CONVEYOR_RETURN_IF_ERROR(Annotate(job_->transport->status(), Who()));
  auto start = Clock::now();
  v1::RunStepReply reply;
  StepState st;
  st.req = &req;
  st.reply = &reply;
  st.train = req.phase() == v1::PHASE_TRAIN;
  st.sizes = MicroBatchSizes(spec, req.batch_size());
  st.offsets = {0};
  for (int64_t n : st.sizes) st.offsets.push_back(st.offsets.back() + n);
  st.timeout = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(spec.stage_timeout_s()));
  if (clock_) {
    st.clock = clock_.get();
    st.origin_us = NowUs();
    clock_->Begin();  // the device is idle here (the last step was waited for): mark 0 is about now
  }
  Status status;
  try {
    if (job_->loader && job_->data->train_size() > 0) {
      BatchLoader::Batch batch = job_->loader->Get(req.phase(), req.step());
      st.inputs = std::move(batch.inputs);
      st.labels = std::move(batch.labels);
      // The next batch is gathered on the host while this step is launched.
      job_->loader->Prefetch(req.phase(), req.step() + 1);
    }
    if ((st.inputs.defined() && st.inputs.size(0) != req.batch_size()) ||
        (st.labels.defined() && st.labels.size(0) != req.batch_size())) {
      return absl::FailedPreconditionError(Who() + ": the data gives a different batch size than " +
                                           std::to_string(req.batch_size()) + " for step " + std::to_string(req.step()));
    }
    std::optional<at::NoGradGuard> no_grad;
    for (Chunk& c : job_->chunks) c.layers->Train(st.train);
    if (st.train) {
      // Recorded graphs accumulate into the gradients they saw: zeroed in place.
      if (job_->graphs) {
        for (const Chunk& c : job_->chunks) GraphedPasses::ZeroGrads(c.params);
      } else if (job_->optimizer) {
        job_->optimizer->zero_grad();
      }
      st.graphed = UseGraphs(req);
    } else {
      no_grad.emplace();
    }
    std::unique_ptr<OpProfile> profile = MaybeStartProfile(req);
    status = RunActions(st);
    if (status.ok()) status = FinishOnDevice(st);
    if (status.ok() && st.train) {
      if (st.graphed) {
        job_->graphs_recorded = true;
      } else {
        job_->trained_eagerly = true;
      }
      reply.set_graphed(st.graphed);
    }
    if (profile) FinishProfile(std::move(profile), req.step() + 1);
    if (status.ok() && st.loss_total.defined()) st.loss_sum = st.loss_total.item<double>();
    if (status.ok() && st.clock) {  // the device's own times for its compute spans
      const std::vector<double> us = st.clock->ElapsedUs();
      for (const auto& d : st.device_spans) {
        v1::TraceEvent* e = reply.mutable_events(d.event);
        e->set_start_us(st.origin_us + static_cast<int64_t>(us[d.start_mark]));
        e->set_end_us(st.origin_us + static_cast<int64_t>(us[d.end_mark]));
        st.busy += (us[d.end_mark] - us[d.start_mark]) * 1e-6;
      }
    }
  } catch (const c10::Error& e) {
    status = absl::InternalError(Who() + " step " + std::to_string(req.step()) + ": " + e.what_without_backtrace());
  }
  if (!status.ok()) {
    LOG_WARN("job ", req.job_id(), " ", Who(), " step ", req.step(), " failed: ", status.message());
    return status;
  }
  reply.set_loss_sum(st.loss_sum);
  reply.set_correct(st.correct);
  reply.set_samples(st.train || st.predictions == 0 ? req.batch_size() : st.predictions);
  reply.set_peak_activations(st.peak_count);
  reply.set_peak_activation_bytes(st.peak_bytes);
  reply.set_busy_seconds(st.busy);
  if (st.train && req.checkpoint()) {
    auto record = SaveCheckpoint(req.step() + 1);
    if (!record.ok()) {
      LOG_WARN("job ", req.job_id(), " ", Who(), ": checkpoint of step ", req.step() + 1, " failed: ",
               record.status().message());
      return Annotate(record.status(), Who() + " writing the checkpoint of step " + std::to_string(req.step() + 1));
    }
    *reply.mutable_checkpoint() = std::move(*record);
  }
  reply.set_step_seconds(std::chrono::duration<double>(Clock::now() - start).count());
  return reply;
}

v1::CheckpointHeader Stage::Impl::CheckpointHeaderFor(int64_t step) const {
  v1::CheckpointHeader h;
  h.set_job_id(job_->assignment.job_id());
  h.set_stage_index(job_->assignment.stage_index());
  h.set_step(step);
  for (const auto& c : job_->assignment.chunks()) {
    v1::ChunkAssignment* ca = h.add_chunks();
    ca->set_index(c.index());
    ca->set_layer_begin(c.layer_begin());
    ca->set_layer_end(c.layer_end());
  }
  Sha256 sum;
  sum.Update(job_->spec().SerializeAsString());
  h.set_spec_digest(HexString(sum.Final()));
  return h;
}

std::string Stage::Impl::SerializeState() {
  torch::serialize::OutputArchive archive;
  int64_t i = 0, j = 0;
  for (const Chunk& c : job_->chunks) {
    for (const auto& p : c.layers->Parameters()) archive.write("p" + std::to_string(i++), p.detach());
    for (const auto& b : c.layers->Buffers()) archive.write("b" + std::to_string(j++), b, /*is_buffer=*/true);
  }
  if (job_->optimizer) {
    torch::serialize::OutputArchive opt;
    job_->optimizer->save(opt);
    archive.write("optimizer", opt);
  }
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    archive.write("rng_cpu", gen.get_state(), /*is_buffer=*/true);
  }
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

Status Stage::Impl::RestoreState(const std::string& payload, const std::string& path) {
  try {
    torch::serialize::InputArchive archive;
    std::istringstream in(payload);
    archive.load_from(in, device_);
    at::NoGradGuard no_grad;
    auto load = [&](const std::string& key, const at::Tensor& into, bool buffer) -> Status {
      at::Tensor t;
      archive.read(key, t, buffer);
      if (!t.defined() || t.sizes() != into.sizes() || t.scalar_type() != into.scalar_type())
        return absl::FailedPreconditionError("checkpoint " + path + ": " + key + " does not fit this stage's layers");
      at::Tensor dst = into;
      dst.copy_(t);
      return absl::OkStatus();
    };
    int64_t i = 0, j = 0;
    for (const Chunk& c : job_->chunks) {
      for (const auto& p : c.layers->Parameters()) CONVEYOR_RETURN_IF_ERROR(load("p" + std::to_string(i++), p, false));
      for (const auto& b : c.layers->Buffers()) CONVEYOR_RETURN_IF_ERROR(load("b" + std::to_string(j++), b, true));
    }
    if (job_->optimizer) {
      torch::serialize::InputArchive opt;
      archive.read("optimizer", opt);
      job_->optimizer->load(opt);
    }
    at::Tensor rng;
    archive.read("rng_cpu", rng, true);
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(rng.to(at::kCPU));
  } catch (const c10::Error& e) {
    return absl::DataLossError("checkpoint " + path + " cannot be read: " + e.what_without_backtrace());
  }
  return absl::OkStatus();
}

StatusOr<v1::CheckpointRecord> Stage::Impl::SaveCheckpoint(int64_t step) {
  std::string payload;
  try {
    payload = SerializeState();
  } catch (const c10::Error& e) {
    return absl::InternalError(std::string("serialising the state: ") + e.what_without_backtrace());
  }
  auto start = Clock::now();
  CONVEYOR_ASSIGN_OR_RETURN(v1::CheckpointRecord record,
                            checkpoints_.Save(CheckpointHeaderFor(step), payload, job_->spec().keep_checkpoints()));
  LOG_DEBUG("job ", job_->assignment.job_id(), " ", Who(), ": checkpoint of step ", step, " (", record.bytes(),
            " bytes) in ", std::chrono::duration<double>(Clock::now() - start).count(), " s");
  return record;
}

StatusOr<v1::LoadCheckpointReply> Stage::Impl::LoadCheckpoint(const v1::LoadCheckpointRequest& req) {
  CONVEYOR_RETURN_IF_ERROR(CheckJob(req.job_id()));
  if (req.step() < 1) return absl::InvalidArgumentError(Who() + ": checkpoints start at step 1");
  v1::LoadCheckpointReply reply;
  v1::CheckpointHeader header;
  const int stage = job_->assignment.stage_index();
  CONVEYOR_ASSIGN_OR_RETURN(std::string payload,
                            checkpoints_.Load(req.job_id(), stage, req.step(), &header, reply.mutable_checkpoint()));
  const v1::CheckpointHeader expected = CheckpointHeaderFor(req.step());
  if (header.spec_digest() != expected.spec_digest())
    return absl::FailedPreconditionError(Who() + ": checkpoint " + reply.checkpoint().path() +
                                         " was written for another job spec");
  for (int i = 0; i < expected.chunks_size(); ++i) {
    if (header.chunks_size() != expected.chunks_size() ||
        header.chunks(i).SerializeAsString() != expected.chunks(i).SerializeAsString())
      return absl::FailedPreconditionError(Who() + ": checkpoint " + reply.checkpoint().path() +
                                           " holds another partition of the model");
  }
  CONVEYOR_RETURN_IF_ERROR(Annotate(RestoreState(payload, reply.checkpoint().path()), Who()));
  // Training goes on at step `step`: its tensors may arrive before its RunStep.
  inbox_.BeginStep(v1::PHASE_TRAIN, req.step() - 1);
  LOG_INFO("job ", req.job_id(), " ", Who(), ": loaded the checkpoint of step ", req.step());
  return reply;
}

StatusOr<v1::DigestReply> Stage::Impl::GetDigest(const v1::JobRef& ref) {
  CONVEYOR_RETURN_IF_ERROR(CheckJob(ref.job_id()));
  v1::DigestReply reply;
  for (const Chunk& c : job_->chunks) {
    for (int i = 0; i < c.layers->num_layers(); ++i) {
      reply.add_layer_digests(c.layers->LayerDigest(i));
      reply.add_layers(c.layers->layer_index(i));
    }
  }
  return reply;
}

StatusOr<v1::ParametersReply> Stage::Impl::GetParameters(const v1::JobRef& ref) {
  CONVEYOR_RETURN_IF_ERROR(CheckJob(ref.job_id()));
  v1::ParametersReply reply;
  for (const Chunk& c : job_->chunks) {
    for (const auto& [name, t] : c.layers->NamedParameters()) {
      v1::NamedTensor* nt = reply.add_parameters();
      nt->set_name(name);
      CONVEYOR_RETURN_IF_ERROR(EncodeTensor(t, nt->mutable_tensor()));
    }
    for (const auto& [name, t] : c.layers->NamedBuffers()) {
      v1::NamedTensor* nt = reply.add_buffers();
      nt->set_name(name);
      CONVEYOR_RETURN_IF_ERROR(EncodeTensor(t, nt->mutable_tensor()));
    }
  }
  return reply;
}

Status Stage::Impl::Release(const v1::JobRef& ref) {
  CONVEYOR_RETURN_IF_ERROR(CheckJob(ref.job_id()));
  DropJob();
  return absl::OkStatus();
}

Status Stage::Impl::Abort(const v1::AbortRequest& req) {
  std::lock_guard<std::mutex> lock(info_mu_);
  if (job_id_ != req.job_id()) return absl::OkStatus();  // nothing of that job runs here
  inbox_.Fail(absl::AbortedError("stage " + std::to_string(stage_index_) + ": step aborted: " + req.reason()));
  return absl::OkStatus();
}

v1::StageInfo Stage::Impl::Info() const {
  v1::StageInfo info;
  info.set_version(CONVEYOR_VERSION);
  info.set_device(device_.str());
  info.set_threads(ComputeThreads());
  info.set_nccl(device_.is_cuda() && options_.transports->SupportsNccl());
  std::lock_guard<std::mutex> lock(info_mu_);
  info.set_job_id(job_id_);
  info.set_stage_index(stage_index_);
  return info;
}

// ----------------------------------------------------------------- Stage --

StatusOr<std::unique_ptr<Stage>> Stage::Create(const StageOptions& options) {
  if (!options.transports) return absl::InvalidArgumentError("a stage needs a transport factory");
  std::optional<at::Device> device;
  try {
    device.emplace(options.device);
  } catch (const c10::Error&) {
    return absl::InvalidArgumentError("unknown device '" + options.device + "' (cpu, cuda or cuda:N)");
  }
  if (device->is_cuda()) {
    if (!at::hasCUDA()) {
      return absl::FailedPreconditionError("device " + options.device + ": this build or machine has no CUDA");
    }
  } else if (!device->is_cpu()) {
    return absl::InvalidArgumentError("device " + options.device + " is not supported (cpu, cuda or cuda:N)");
  }
  SetComputeThreads(options.threads);
  return std::unique_ptr<Stage>(new Stage(std::make_unique<Impl>(options, *device)));
}

Stage::Stage(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Stage::~Stage() { Shutdown(); }

namespace {
Status Stopped() { return absl::UnavailableError("the stage is shutting down"); }
}  // namespace

// Every call but Abort and Info runs on the executor, which owns the model.
#define CONVEYOR_ON_EXECUTOR(Reply, call) \
  impl_->executor().Run([&] { return impl_->call; }, Reply(Stopped()))

StatusOr<v1::ProbeReply> Stage::Probe(const v1::ProbeRequest& req) {
  return CONVEYOR_ON_EXECUTOR(StatusOr<v1::ProbeReply>, Probe(req));
}
StatusOr<v1::DescribeReply> Stage::Describe(const v1::JobSpec& spec) {
  return CONVEYOR_ON_EXECUTOR(StatusOr<v1::DescribeReply>, Describe(spec));
}

StatusOr<v1::ProfileReply> Stage::Profile(const v1::ProfileRequest& req) {
  return CONVEYOR_ON_EXECUTOR(StatusOr<v1::ProfileReply>, Profile(req));
}
StatusOr<v1::ConfigureReply> Stage::Configure(const v1::StageAssignment& a) {
  return CONVEYOR_ON_EXECUTOR(StatusOr<v1::ConfigureReply>, Configure(a));
}
StatusOr<v1::LinkSetup> Stage::PrepareLink(const v1::JobRef& ref) {
  return CONVEYOR_ON_EXECUTOR(StatusOr<v1::LinkSetup>, PrepareLink(ref));
}
StatusOr<v1::ConnectReply> Stage::Connect(const v1::JobRef& ref) {
  return CONVEYOR_ON_EXECUTOR(StatusOr<v1::ConnectReply>, Connect(ref));
}
StatusOr<v1::RunStepReply> Stage::RunStep(const v1::RunStepRequest& req) {
  return CONVEYOR_ON_EXECUTOR(StatusOr<v1::RunStepReply>, RunStep(req));
}
StatusOr<v1::DigestReply> Stage::GetDigest(const v1::JobRef& ref) {
  return CONVEYOR_ON_EXECUTOR(StatusOr<v1::DigestReply>, GetDigest(ref));
}
StatusOr<v1::ParametersReply> Stage::GetParameters(const v1::JobRef& ref) {
  return CONVEYOR_ON_EXECUTOR(StatusOr<v1::ParametersReply>, GetParameters(ref));
}
StatusOr<v1::LoadCheckpointReply> Stage::LoadCheckpoint(const v1::LoadCheckpointRequest& req) {
  return CONVEYOR_ON_EXECUTOR(StatusOr<v1::LoadCheckpointReply>, LoadCheckpoint(req));
}
Status Stage::Release(const v1::JobRef& ref) { return CONVEYOR_ON_EXECUTOR(Status, Release(ref)); }
#undef CONVEYOR_ON_EXECUTOR

Status Stage::Abort(const v1::AbortRequest& req) { return impl_->Abort(req); }
v1::StageInfo Stage::Info() const { return impl_->Info(); }
Inbox& Stage::inbox() { return impl_->inbox(); }

void Stage::Shutdown() {
  impl_->inbox().Fail(Stopped());
  impl_->executor().Shutdown();
}

}  // namespace conveyor
