#include "stage_server/stage.h"

#include "stage_server/stage_impl.h"
#include "stage_server/stage_metrics.h"
#include "transport/nccl/nccl_channel.h"

#include <thread>

namespace conveyor {
namespace {

// What `layers` make of one sample of `inputs`: each output tensor's dtype,
// per-sample shape and whether it carries a gradient back (a floating
// tensor that requires grad when the inputs that take gradients do).
// c10::Error if they cannot take it.
StatusOr<std::vector<v1::SampleSpec>> ProbeSpecs(Partition& layers, const std::vector<v1::SampleSpec>& inputs,
                                                 const at::Device& device) {
  at::AutoGradMode grad_mode(true);
  Tensors x;
  for (const v1::SampleSpec& in : inputs) {
    std::vector<int64_t> probe{1};
    probe.insert(probe.end(), in.shape().begin(), in.shape().end());
    at::Tensor t = at::zeros(probe, at::TensorOptions().device(device).dtype(FromWireDType(in.dtype())));
    if (in.requires_grad() && at::isFloatingType(t.scalar_type())) t.requires_grad_(true);
    x.push_back(std::move(t));
  }
  // Eval mode: BatchNorm cannot train on one sample, and the probe must not
  // move its running statistics.
  const bool training = layers.is_training();
  layers.Train(false);
  auto out = layers.Forward(x);
  layers.Train(training);
  if (!out.ok()) return out.status();
  std::vector<v1::SampleSpec> specs;
  for (std::size_t i = 0; i < out->size(); ++i) {
    const at::Tensor& o = (*out)[i];
    const std::string which = out->size() > 1 ? "output tensor " + std::to_string(i) : "the output";
    auto dtype = ToWireDType(o.scalar_type());
    if (!dtype.ok()) return Annotate(dtype.status(), which);
    if (o.dim() < 1 || o.size(0) != 1) {
      return absl::InvalidArgumentError(which + " has shape " + ShapeString(ToVector(o.sizes())) +
                                        " for one sample: every tensor that crosses a stage boundary must have the "
                                        "batch as its first dimension");
    }
    v1::SampleSpec spec;
    spec.set_dtype(*dtype);
    for (int64_t d : o.sizes().slice(1)) spec.add_shape(d);
    spec.set_requires_grad(at::isFloatingType(o.scalar_type()) && o.requires_grad());
    specs.push_back(std::move(spec));
  }
  return specs;
}

// What a chunk takes in: `specs` when given, else (an assignment or probe
// without them) one tensor of `shape`, the model's input or an activation.
std::vector<v1::SampleSpec> InputSpecs(const google::protobuf::RepeatedPtrField<v1::SampleSpec>& specs,
                                       const google::protobuf::RepeatedField<int64_t>& shape,
                                       const v1::JobSpec& job, bool first) {
  if (!specs.empty()) return {specs.begin(), specs.end()};
  v1::SampleSpec one;
  one.set_dtype(first ? InputDType(job) : ActivationDType(job));
  *one.mutable_shape() = shape;
  one.set_requires_grad(!first);
  return {one};
}

Status CheckSampleSpecs(const std::vector<v1::SampleSpec>& specs, const std::string& who) {
  if (specs.empty() || specs.size() > 64)
    return absl::InvalidArgumentError(who + ": 1 to 64 tensors cross a stage boundary");
  for (const v1::SampleSpec& s : specs) {
    if (s.shape_size() > 8) return absl::InvalidArgumentError(who + ": a sample shape has at most 8 dimensions");
    for (int64_t d : s.shape())
      if (d <= 0 || d > (int64_t{1} << 31)) return absl::InvalidArgumentError(who + ": bad sample shape");
    if (!v1::DType_IsValid(s.dtype()) || s.dtype() == v1::DTYPE_UNSPECIFIED)
      return absl::InvalidArgumentError(who + ": a tensor without a dtype");
  }
  return absl::OkStatus();
}

std::string SpecsString(const std::vector<v1::SampleSpec>& specs) {
  std::string out;
  for (const v1::SampleSpec& s : specs) {
    if (!out.empty()) out += ", ";
    out += ShapeString({s.shape().begin(), s.shape().end()}) + " " +
           std::string(c10::toString(FromWireDType(s.dtype())));
  }
  return specs.size() == 1 ? out : "(" + out + ")";
}

Status CheckSampleShape(const google::protobuf::RepeatedField<int64_t>& shape, const std::string& who) {
  if (shape.empty() || shape.size() > 8) return absl::InvalidArgumentError(who + ": a sample shape needs 1 to 8 dimensions");
  for (int64_t d : shape)
    if (d <= 0 || d > (int64_t{1} << 31)) return absl::InvalidArgumentError(who + ": bad sample shape");
  return absl::OkStatus();
}

}  // namespace

Status Stage::Impl::CheckJob(const std::string& job_id) const {
  if (!job_) return absl::FailedPreconditionError("this stage has no job configured (asked for '" + job_id + "')");
  if (job_->assignment.job_id() != job_id) {
    return absl::FailedPreconditionError("this stage runs job '" + job_->assignment.job_id() + "', not '" +
                                         job_id + "'");
  }
  return absl::OkStatus();
}

Status Stage::Impl::CheckDeployment(int64_t deployment, const std::string& what) const {
  const int64_t held = job_->assignment.deployment();
  if (deployment == held) return absl::OkStatus();
  return absl::AbortedError(Who() + ": " + what + " was sent to configuration " + std::to_string(deployment) +
                            " of the job, and the coordinator has configured it anew since (configuration " +
                            std::to_string(held) + "): not run");
}

namespace {

NcclOptions NcclOptionsOf(const v1::JobSpec& spec) {
  NcclOptions nccl;
  nccl.ctas = NcclCtas(spec);
  nccl.shm_headers = spec.nccl_headers() == v1::NCCL_HEADERS_SHM;
  return nccl;
}

}  // namespace

int Stage::Impl::NcclLinks() const {
  if (!job_ || !job_->transport) return 0;
  int links = 0;
  if (!job_->assignment.upstream().empty() && job_->transport->Kind(Peer::kUpstream) == v1::LINK_NCCL) ++links;
  if (!job_->assignment.downstream().empty() && job_->transport->Kind(Peer::kDownstream) == v1::LINK_NCCL) ++links;
  return links;
}

void Stage::Impl::ReserveSmsForNccl() {
  const v1::JobSpec& spec = job_->spec();
  const int links = NcclLinks();
  if (links > 0 && NcclCtas(spec) != spec.nccl_ctas()) {
    LOG_WARN(Who(), ": nccl_ctas 0 (NCCL's own choice) with cuda_graphs deadlocks NCCL links; they use ",
             NcclCtas(spec), " thread blocks per communicator");
  }
  int sms = spec.matmul_sm_carveout() == v1::SM_CARVEOUT_FIXED ? spec.matmul_sm_carveout_sms() : 0;
  if (spec.matmul_sm_carveout() == v1::SM_CARVEOUT_AUTO) {  // what this stage's NCCL kernels may hold at once
    sms = NcclCtas(spec) * 2 * links;  // a communicator each way per link
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
  // The links close while the rest of the job (the replicas' communicator
  // among it) is destroyed: each NCCL abort takes about a second, and a
  // replica's server released in 1.0 s where it took 1.5 one after the other
  // (4x H200, docs/recovery.md).
  std::thread links;
  if (job_ && job_->transport) links = std::thread([transport = job_->transport] { transport->Shutdown(); });
  job_.reset();
  if (links.joinable()) links.join();
  if (device_.is_cuda()) EmptyCudaCache();  // what the job held goes back to the device
  std::lock_guard<std::mutex> lock(info_mu_);
  job_id_.clear();
  stage_index_ = -1;
  deployment_ = 0;
  replica_ = 0;
  aborted_.clear();
  next_train_step_ = -1;
  turn_cv_.notify_all();
  RecordIdleStage(device_.str());
}

StatusOr<v1::ProbeReply> Stage::Impl::Probe(const v1::ProbeRequest& req) {
  CONVEYOR_RETURN_IF_ERROR(ValidateJobSpec(req.spec()));
  if (req.inputs().empty()) CONVEYOR_RETURN_IF_ERROR(CheckSampleShape(req.input_sample_shape(), "probe"));
  v1::JobSpec spec = req.spec();
  CONVEYOR_RETURN_IF_ERROR(ResolveJobPaths(&spec, options_.data_roots));
  // The chain's first layer is layer 0; any later one takes activations.
  const std::vector<v1::SampleSpec> inputs =
      InputSpecs(req.inputs(), req.input_sample_shape(), spec, req.layer_begin() == 0);
  CONVEYOR_RETURN_IF_ERROR(CheckSampleSpecs(inputs, "probe"));
  CONVEYOR_ASSIGN_OR_RETURN(std::unique_ptr<Partition> layers,
                            BuildPartition(spec, req.layer_begin(), req.layer_end(), /*init=*/false));
  v1::ProbeReply reply;
  const std::string what = "layers [" + std::to_string(req.layer_begin()) + ", " + std::to_string(req.layer_end()) +
                           ") cannot take samples of shape " + SpecsString(inputs);
  try {
    auto specs = ProbeSpecs(*layers, inputs, at::kCPU);
    if (!specs.ok()) return Annotate(specs.status(), what);
    for (int64_t d : specs->front().shape()) reply.add_output_sample_shape(d);
    for (auto& o : *specs) *reply.add_outputs() = std::move(o);
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

namespace {

// An idle GPU runs at a fraction of its clock until it has worked for a
// while: without this the first layers timed look the costliest, and the cut
// moved a W2 block off the stage that needed one.
void WarmUpGpu(const at::Device& device) {
  const at::Tensor a = at::ones({4096, 4096}, at::TensorOptions().device(device).dtype(at::kBFloat16));
  const auto until = SteadyClock::now() + std::chrono::milliseconds(500);
  while (SteadyClock::now() < until) at::mm(a, a).sum().item<double>();
}

}  // namespace

StatusOr<v1::ProfileReply> Stage::Impl::Profile(const v1::ProfileRequest& req) {
  v1::JobSpec spec = req.spec();
  CONVEYOR_RETURN_IF_ERROR(ValidateJobSpec(spec));
  CONVEYOR_RETURN_IF_ERROR(ResolveJobPaths(&spec, options_.data_roots));
  const int64_t rows = MicroBatchSizes(spec, spec.batch_size()).front();
  std::vector<int64_t> shape{rows};
  for (int64_t d : InputSampleShape(spec)) shape.push_back(d);
  v1::ProfileReply reply;
  try {
    const bool channels_last = UsesChannelsLast(spec, device_);  // timed as the job will run
    at::Tensor input = at::zeros(shape, at::TensorOptions().device(device_).dtype(FromWireDType(InputDType(spec))));
    if (channels_last && input.dim() == 4) input = input.contiguous(at::MemoryFormat::ChannelsLast);
    Tensors x{input};
    std::vector<int64_t> label_shape{rows};
    for (int64_t d : LabelSampleShape(spec)) label_shape.push_back(d);
    const at::Tensor labels =
        at::zeros(label_shape, at::TensorOptions().device(device_).dtype(FromWireDType(LabelDType(spec))));
    const int layers = NumLayers(spec.model());
    if (req.time() && device_.is_cuda()) WarmUpGpu(device_);
    for (int i = 0; i < layers; ++i) {
      CONVEYOR_ASSIGN_OR_RETURN(std::unique_ptr<Partition> layer, BuildPartition(spec, i, i + 1, /*init=*/false));
      layer->To(device_);
      if (channels_last) ToChannelsLast(*layer);
      v1::LayerCost* cost = reply.add_layers();
      for (const auto& p : layer->Parameters()) cost->set_parameters(cost->parameters() + p.numel());
      Tensors out;
      auto run = [&] {  // forward and backward, waiting for the device at the end
        Tensors input;
        for (const at::Tensor& t : x)
          input.push_back(at::isFloatingType(t.scalar_type()) ? t.detach().requires_grad_(true) : t);
        out = ValueOrThrow(layer->Forward(input));
        if (i + 1 == layers) {
          // The last layer's stage also computes the loss (for a language
          // model, over logits as large as the vocabulary): it counts here.
          at::Tensor loss = ComputeLoss(spec, out.front(), labels, 1.0);
          if (loss.requires_grad()) loss.backward();
        } else {
          Tensors roots, ones;
          for (const at::Tensor& o : out) {
            if (!o.requires_grad()) continue;
            roots.push_back(o);
            ones.push_back(at::ones_like(o));
          }
          if (!roots.empty()) torch::autograd::backward(roots, ones);
        }
        double sum = 0;
        for (const at::Tensor& o : out) sum += o.sum().item<double>();
        return sum;
      };
      if (req.time()) {
        run();  // warm-up: allocations, kernel selection
        std::vector<double> seconds;  // the median of 5: one hiccup moves no cut
        for (int r = 0; r < 5; ++r) {
          auto start = SteadyClock::now();
          run();
          seconds.push_back(std::chrono::duration<double>(SteadyClock::now() - start).count());
        }
        std::nth_element(seconds.begin(), seconds.begin() + 2, seconds.end());
        cost->set_seconds(seconds[2]);
      } else {
        at::NoGradGuard no_grad;
        out = ValueOrThrow(layer->Forward(x));
      }
      x.clear();
      for (const at::Tensor& o : out) {
        x.push_back(o.detach());
        cost->set_output_bytes(cost->output_bytes() + static_cast<int64_t>(o.nbytes()));
      }
    }
  } catch (const std::exception& e) {  // c10::Error, std::bad_alloc, StatusError
    return TorchFailure(e, absl::StatusCode::kInternal, "profiling the model");
  }
  return reply;
}

StatusOr<v1::ConfigureReply> Stage::Impl::Configure(const v1::StageAssignment& a) {
  const std::string who = Who(a);
  CONVEYOR_RETURN_IF_ERROR(CheckAssignment(a, who));
  NamedTensors init_from;
  if (!a.spec().init_from().empty()) {
    CONVEYOR_ASSIGN_OR_RETURN(init_from, ReadStateDict(a.spec().init_from()));
    CONVEYOR_RETURN_IF_ERROR(CheckInitialWeightNames(a.spec(), init_from));
  }
  DropJob();
  if (device_.is_cuda()) ResetCudaPeak(device_.str());  // the job's own peak (ReportMemory)
  if (device_.is_cuda()) SetCudnnBenchmark(a.spec().cudnn_benchmark());

  auto job = std::make_unique<Job>();
  job->assignment = a;
  job->recompute = RecomputeOn(a.spec(), a.stage_index());
  int64_t num_params = 0;
  NamedTensors all_params;  // the trainable ones, named
  for (const v1::ChunkAssignment& ca : a.chunks()) {
    CONVEYOR_ASSIGN_OR_RETURN(Chunk c, ConfigureChunk(*job, ca, who, init_from));
    for (const auto& [name, p] : c.layers->NamedParameters()) {
      num_params += p.numel();
      if (!p.requires_grad()) continue;
      c.params.push_back(p);
      all_params.emplace_back(name, p);
      job->param_names.push_back(name);
    }
    job->chunks.push_back(std::move(c));
  }
  CONVEYOR_RETURN_IF_ERROR(OpenJobData(*job, who));
  ChooseGraphs(*job, who);
  // After the graphs: a stage that replays them keeps no hooks on its gradients.
  CONVEYOR_RETURN_IF_ERROR(JoinReplicas(*job));
  ParameterGroups groups;
  CONVEYOR_RETURN_IF_ERROR(MakeJobOptimizer(*job, all_params, num_params, who, &groups));
  OpenInbox(*job);

  v1::ConfigureReply reply = ConfigureReplyFor(*job, num_params);
  LogConfigured(*job, num_params, groups, who);
  job_ = std::move(job);
  std::lock_guard<std::mutex> lock(info_mu_);
  job_id_ = a.job_id();
  deployment_ = a.deployment();
  stage_index_ = a.stage_index();
  replica_ = a.replica();
  next_train_step_ = 0;
  stage_timeout_s_ = a.spec().stage_timeout_s();
  turn_cv_.notify_all();
  return reply;
}

Status Stage::Impl::CheckAssignment(const v1::StageAssignment& a, const std::string& who) const {
  if (a.job_id().empty()) return absl::InvalidArgumentError(who + ": job_id is empty");
  CONVEYOR_RETURN_IF_ERROR(Annotate(ValidateJobSpec(a.spec()), who));
  if (a.num_stages() < 1 || a.stage_index() < 0 || a.stage_index() >= a.num_stages()) {
    return absl::InvalidArgumentError(who + ": stage index out of range for " + std::to_string(a.num_stages()) +
                                      " stages");
  }
  if (a.chunks().empty() || a.num_chunks() < a.chunks_size() || a.num_chunks() > 4096)
    return absl::InvalidArgumentError(who + ": a stage needs 1 or more of the model's chunks");
  // A job that checkpoints finds out now, not at its first checkpoint: only
  // replica 0's stages write them (the other copies need no storage).
  if (a.spec().checkpoint_every() > 0 && a.replica() == 0 && options_.checkpoint_dir.empty()) {
    return absl::FailedPreconditionError(who + ": the job has checkpoint_every: " +
                                         std::to_string(a.spec().checkpoint_every()) +
                                         ", but this stage server was started without --checkpoint-dir, so it cannot "
                                         "write checkpoints (give it one, or checkpoint_every: 0)");
  }
  if (a.spec().precision() == v1::PRECISION_FP16_MIXED && !device_.is_cuda()) {
    return absl::InvalidArgumentError(who + " is on " + device_.str() +
                                      ": precision fp16-mixed needs a CUDA device (float16 autocast); use bf16-mixed");
  }
  // The coordinator resolved the job's paths under its roots; this stage
  // reads them only under its own.
  v1::JobSpec checked = a.spec();
  return ResolveJobPaths(&checked, options_.data_roots);
}

namespace {

// A chunk's outputs against what its assignment promised (when it says).
Status CheckPromisedChunkOutputs(const v1::ChunkAssignment& ca, const std::vector<v1::SampleSpec>& outputs,
                                 const std::string& what) {
  const std::vector<int64_t> made(outputs.front().shape().begin(), outputs.front().shape().end());
  std::vector<int64_t> promised(ca.output_sample_shape().begin(), ca.output_sample_shape().end());
  if (!promised.empty() && promised != made) {
    return absl::InvalidArgumentError(what + ": outputs samples of shape " + ShapeString(made) +
                                      ", the assignment says " + ShapeString(promised));
  }
  if (!ca.outputs().empty()) {
    const std::vector<v1::SampleSpec> said(ca.outputs().begin(), ca.outputs().end());
    if (SpecsString(said) != SpecsString(outputs)) {
      return absl::InvalidArgumentError(what + ": outputs samples of " + SpecsString(outputs) +
                                        ", the assignment says " + SpecsString(said));
    }
  }
  return absl::OkStatus();
}

}  // namespace

StatusOr<Stage::Impl::Chunk> Stage::Impl::ConfigureChunk(const Job& job, const v1::ChunkAssignment& ca,
                                                         const std::string& who, const NamedTensors& init_from) {
  const v1::StageAssignment& a = job.assignment;
  const std::string what = who + " chunk " + std::to_string(ca.index());
  if (ca.index() < 0 || ca.index() >= a.num_chunks() ||
      StageOfChunk(a.spec().schedule(), ca.index(), a.num_stages()) != a.stage_index())
    return absl::InvalidArgumentError(what + ": not a chunk of this stage");
  Chunk c;
  c.index = ca.index();
  if (ca.inputs().empty()) CONVEYOR_RETURN_IF_ERROR(CheckSampleShape(ca.input_sample_shape(), what));
  c.inputs = InputSpecs(ca.inputs(), ca.input_sample_shape(), a.spec(), c.index == 0);
  CONVEYOR_RETURN_IF_ERROR(CheckSampleSpecs(c.inputs, what));
  // Built and initialised on the host with every core (one thread trains on CUDA).
  AllCoresWhileBuilding all_cores(device_.is_cuda() && options_.threads == 0);
  CONVEYOR_ASSIGN_OR_RETURN(c.layers, BuildPartition(a.spec(), ca.layer_begin(), ca.layer_end()));
  const std::string cannot = what + ": layers [" + std::to_string(ca.layer_begin()) + ", " +
                             std::to_string(ca.layer_end()) + ") cannot take samples of shape " +
                             SpecsString(c.inputs);
  try {
    if (!init_from.empty()) CONVEYOR_RETURN_IF_ERROR(LoadInitialWeights(a.spec(), init_from, *c.layers));
    c.layers->To(device_);
    if (UsesChannelsLast(a.spec(), device_)) ToChannelsLast(*c.layers);
    auto specs = ProbeSpecs(*c.layers, c.inputs, device_);
    if (!specs.ok()) return Annotate(specs.status(), cannot);
    c.outputs = std::move(*specs);
    if (job.IsLast(c) && c.outputs.size() != 1) {
      return absl::InvalidArgumentError(what + ": the model's last layer returns " +
                                        std::to_string(c.outputs.size()) + " tensors; the loss takes one");
    }
  } catch (const std::exception& e) {
    return TorchFailure(e, absl::StatusCode::kInvalidArgument, cannot);
  }
  CONVEYOR_RETURN_IF_ERROR(CheckPromisedChunkOutputs(ca, c.outputs, what));
  return std::move(c);
}

Status Stage::Impl::OpenJobData(Job& job, const std::string& who) {
  const v1::StageAssignment& a = job.assignment;
  bool reads_inputs = false, reads_labels = false;
  for (const Chunk& c : job.chunks) {
    reads_inputs |= job.IsFirst(c);
    reads_labels |= job.IsLast(c);
  }
  if (reads_inputs || reads_labels) {
    auto data = Dataset::Open(a.spec(), reads_inputs, reads_labels);
    if (!data.ok()) return Annotate(data.status(), who);
    job.data = std::move(*data);
    if (a.num_replicas() > 1) job.data->ReadShare(a.replica());
    job.loader = std::make_unique<BatchLoader>(job.assignment.spec(), job.data.get(), device_, reads_inputs,
                                               reads_labels);
  }
  for (const Chunk& c : job.chunks) {  // loss: {torchscript}, checked before the first step
    if (!job.IsLast(c) || c.outputs.empty()) continue;
    const auto& shape = c.outputs.front().shape();
    const std::vector<int64_t> output(shape.begin(), shape.end());
    CONVEYOR_RETURN_IF_ERROR(Annotate(CheckLoss(a.spec(), output), who));
    // Bad targets named now, not as an INTERNAL error at the first step.
    if (job.data) CONVEYOR_RETURN_IF_ERROR(Annotate(job.data->CheckTargets(output), who));
  }
  return absl::OkStatus();
}

void Stage::Impl::ChooseGraphs(Job& job, const std::string& who) {
  const v1::StageAssignment& a = job.assignment;
  const bool one_tensor = std::all_of(job.chunks.begin(), job.chunks.end(), [](const Chunk& c) {
    return c.inputs.size() == 1 && c.outputs.size() == 1;
  });
  const GraphsChoice graphs = CudaGraphsFor(a.spec(), /*reference=*/false);
  if (device_.is_cuda() && !graphs.on && !a.spec().has_cuda_graphs()) {
    LOG_INFO("job ", a.job_id(), " ", who, ": ", graphs.why_off);
  }
  if (!graphs.on) return;
  if (!one_tensor) {
    LOG_INFO("job ", a.job_id(), " ", who, ": cuda_graphs ignored: tuples cross this stage's boundaries");
  } else if (GraphedPasses::Available(device_)) {
    job.graphs = std::make_unique<GraphedPasses>(device_);
  } else if (a.spec().has_cuda_graphs()) {
    LOG_INFO("job ", a.job_id(), " ", who, ": cuda_graphs ignored on ", device_.str());
  }
}

Status Stage::Impl::MakeJobOptimizer(Job& job, const NamedTensors& all_params, int64_t num_params,
                                     const std::string& who, ParameterGroups* groups) {
  const v1::StageAssignment& a = job.assignment;
  NamedTensors updated = all_params;  // by this stage's optimizer
  if (job.reducer && a.spec().zero_stage() >= 1 && !all_params.empty()) {
    at::NoGradGuard no_grad;  // before any graph records the parameters' addresses
    updated.clear();
    for (GradientReducer::Part& part : job.reducer->SliceParameters()) {
      updated.emplace_back(all_params[part.param].first, part.tensor);
      job.updated.push_back(std::move(part.tensor));
      job.updated_params.push_back(part.param);
    }
    job.sliced = true;
    if (updated.empty()) {
      return absl::FailedPreconditionError(who + ": zero 1 slices this stage's " + std::to_string(num_params) +
                                           " parameter elements over " + std::to_string(a.num_replicas()) +
                                           " replicas, and none fall in this replica's slices");
    }
  }
  if (!updated.empty()) job.optimizer = MakeOptimizer(a.spec().optimizer(), updated, groups);
  return absl::OkStatus();
}

void Stage::Impl::OpenInbox(const Job& job) {
  const v1::StageAssignment& a = job.assignment;
  const v1::JobSpec& spec = a.spec();
  std::vector<int64_t> train_mbs = MicroBatchSizes(spec, spec.batch_size());
  std::vector<int64_t> eval_mbs = MicroBatchSizes(spec, spec.eval_batch_size());
  InboxExpectations expect;
  expect.job_id = a.job_id();
  expect.stage_index = a.stage_index();
  expect.replica = a.replica();
  expect.num_stages = a.num_stages();
  expect.dtype = ActivationDType(spec);
  if (spec.precision() == v1::PRECISION_BF16_MIXED) expect.other_dtype = v1::DTYPE_BFLOAT16;
  if (spec.precision() == v1::PRECISION_FP16_MIXED) expect.other_dtype = v1::DTYPE_FLOAT16;
  expect.batches_per_step = AccumulateSteps(spec);
  expect.steps_in_flight = StepsInFlight(spec);
  for (const Chunk& c : job.chunks) {
    // By part: each tensor of a tuple is a frame with its own dtype and shape.
    if (!job.IsFirst(c)) {
      expect.activation_shapes[c.index].assign(c.inputs.front().shape().begin(), c.inputs.front().shape().end());
      for (int i : PartsOf(c.inputs, /*all=*/true)) {
        const v1::SampleSpec& in = c.inputs[static_cast<std::size_t>(i)];
        expect.activation_parts[c.index][i] = {in.dtype(), {in.shape().begin(), in.shape().end()}};
      }
    }
    if (!job.IsLast(c)) {
      expect.gradient_shapes[c.index].assign(c.outputs.front().shape().begin(), c.outputs.front().shape().end());
      auto& parts = expect.gradient_parts[c.index];
      for (int i : PartsOf(c.outputs, /*all=*/false)) {
        const v1::SampleSpec& out = c.outputs[static_cast<std::size_t>(i)];
        parts[i] = {out.dtype(), {out.shape().begin(), out.shape().end()}};
      }
    }
  }
  expect.max_micro_batches = static_cast<int>(std::max(train_mbs.size(), eval_mbs.size()));
  expect.max_micro_batch_size = std::max(train_mbs.front(), eval_mbs.front());
  inbox_.Open(std::move(expect));
  inbox_.SetSpin(device_.is_cuda() ? kGpuInboxSpin : std::chrono::microseconds(0));
}

v1::ConfigureReply Stage::Impl::ConfigureReplyFor(const Job& job, int64_t num_params) const {
  v1::ConfigureReply reply;
  for (int64_t d : job.chunks.back().outputs.front().shape()) reply.add_output_sample_shape(d);
  reply.set_num_parameters(num_params);
  reply.set_device(device_.str());
  if (job.replica_store) reply.set_replica_store_port(job.replica_store->port());
  if (job.data) {
    reply.set_train_samples(job.data->train_size());
    reply.set_test_samples(job.data->test_size());
  }
  return reply;
}

void Stage::Impl::LogConfigured(const Job& job, int64_t num_params, const ParameterGroups& groups,
                                const std::string& who) const {
  const v1::StageAssignment& a = job.assignment;
  std::string ranges;
  for (const auto& ca : a.chunks())
    ranges += (ranges.empty() ? "" : ", ") + std::string("[") + std::to_string(ca.layer_begin()) + ", " +
              std::to_string(ca.layer_end()) + ")";
  LOG_INFO("job ", a.job_id(), " ", who, ": layers ", ranges, ", ", num_params, " parameters on ", device_.str(),
           job.recompute ? ", recomputing forwards" : "", job.graphs ? ", as CUDA graphs from the second step" : "");
  if (job.optimizer)
    LOG_INFO("job ", a.job_id(), " ", who, ": parameter groups: ", groups.Describe(a.spec().optimizer().weight_decay()));
}

Status Stage::Impl::JoinReplicas(Job& job) {
  const v1::StageAssignment& a = job.assignment;
  if (a.num_replicas() <= 1) return absl::OkStatus();
  const std::string who = Who(a);  // with replicas: "stage S of replica R"
  if (a.replica() < 0 || a.replica() >= a.num_replicas())
    return absl::InvalidArgumentError(who + ": replica out of range for " + std::to_string(a.num_replicas()) +
                                      " replicas");
  const auto timeout = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::duration<double>(a.spec().stage_timeout_s()));
  ReplicaGroup::Options o;
  o.rank = a.replica();
  o.size = a.num_replicas();
  o.timeout = timeout;
  o.who = who;
  o.host = a.replica_host().empty() ? "127.0.0.1" : a.replica_host();
  if (a.replica_collectives() == v1::COLLECTIVES_NCCL) {
    if (!device_.is_cuda() || !NcclBuilt())
      return absl::FailedPreconditionError(who + ": collectives nccl, but this stage is on " + device_.str() +
                                           (device_.is_cuda() ? " in a server built without NCCL" : ""));
    o.nccl = true;
    o.device = device_;
    o.interrupted = [this] { return inbox_.failure(); };
  }
  if (a.replica() == 0) {  // serves its group's store; joins it on its own host
    auto store = ReplicaStore::Serve(timeout);
    if (!store.ok()) return Annotate(store.status(), who);
    job.replica_store = std::move(*store);
    o.store = "127.0.0.1:" + std::to_string(job.replica_store->port());
  } else if (a.replica_store().empty()) {
    return absl::InvalidArgumentError(who + ": replica_store is empty (the address of replica 0's store)");
  } else {
    o.store = a.replica_store();
  }
  job.replica_group = std::make_unique<ReplicaGroup>(std::move(o));
  std::vector<at::Tensor> params;
  for (const Chunk& c : job.chunks) {
    job.chunk_params.push_back(params.size());
    params.insert(params.end(), c.params.begin(), c.params.end());
  }
  job.chunk_params.push_back(params.size());
  // Replayed passes run no hooks, and a hook's gradient accumulator, kept
  // alive, would keep the stream it was made on: backward captured on the
  // graph's stream then made the legacy stream wait on it, which CUDA refuses
  // (2x H100, 2026-11-26). With graphs the buckets all start after backward.
  job.reducer = std::make_unique<GradientReducer>(job.replica_group.get(), std::move(params),
                                                  static_cast<int64_t>(BucketCapMb(a.spec()) * 1024 * 1024),
                                                  /*hooks=*/job.graphs == nullptr,
                                                  /*slice=*/a.spec().zero_stage() >= 1);
  return absl::OkStatus();
}

StatusOr<v1::LinkSetup> Stage::Impl::PrepareLink(const v1::JobRef& ref) {
  CONVEYOR_RETURN_IF_ERROR(CheckJob(ref.job_id()));
  if (job_->assignment.downstream().empty()) return absl::FailedPreconditionError(Who() + " has no downstream link");
  job_->prepared_link.reset();
  auto link = options_.transports->PrepareLink(device_.str(), NcclOptionsOf(job_->spec()), &job_->prepared_link);
  if (!link.ok()) return Annotate(link.status(), Who());
  job_->downstream_link = *link;
  return *link;
}

StatusOr<v1::ConnectReply> Stage::Impl::Connect(const v1::JobRef& ref) {
  CONVEYOR_RETURN_IF_ERROR(CheckJob(ref.job_id()));
  v1::ConnectReply reply;
  if (job_->transport) job_->transport->Shutdown();
  if (job_->spec().schedule() == v1::SCHEDULE_ZBV) job_->turn_link = std::make_unique<LoopbackTransport>(&inbox_);
  if (job_->assignment.num_stages() == 1) {  // its chunks pass tensors to themselves
    job_->transport = std::make_unique<LoopbackTransport>(&inbox_);
    reply.set_transport(v1::LINK_NONE);
    return reply;
  }
  auto deadline = SteadyClock::now() + std::chrono::duration_cast<SteadyClock::duration>(
                                     std::chrono::duration<double>(job_->spec().stage_timeout_s()));
  LinkOptions links;
  links.upstream = ref.upstream_link();
  links.downstream = job_->downstream_link;
  links.device = device_.str();
  links.inbox = &inbox_;
  links.timeout = std::chrono::duration<double>(job_->spec().stage_timeout_s());
  links.nccl = NcclOptionsOf(job_->spec());
  links.prepared = std::move(job_->prepared_link);
  auto transport = options_.transports->Connect(job_->assignment, links, deadline);
  if (!transport.ok()) return Annotate(transport.status(), Who());
  job_->transport = std::move(*transport);
  ReserveSmsForNccl();
  // The link this stage reports is the one to its next stage (the last stage: from its previous one).
  reply.set_transport(job_->transport->Kind(job_->assignment.downstream().empty() ? Peer::kUpstream : Peer::kDownstream));
  return reply;
}

StatusOr<v1::Empty> Stage::Impl::Release(const v1::JobRef& ref) {
  CONVEYOR_RETURN_IF_ERROR(CheckJob(ref.job_id()));
  const auto start = SteadyClock::now();
  DropJob();
  LOG_INFO("job ", ref.job_id(), ": released in ",
           std::chrono::duration<double>(SteadyClock::now() - start).count(), " s");
  return v1::Empty();
}

StatusOr<v1::StageInfo> Stage::Impl::GetInfo(const v1::Empty&) { return Info(); }

StatusOr<v1::Empty> Stage::Impl::Abort(const v1::AbortRequest& req) {
  std::lock_guard<std::mutex> lock(info_mu_);
  if (job_id_ != req.job_id()) return v1::Empty();  // nothing of that job runs here
  // Also a step that has not begun yet: the coordinator configures the job
  // anew (or ends it) before it steps it again.
  aborted_ = "stage " + std::to_string(stage_index_) + ": step aborted: " + req.reason();
  inbox_.Fail(absl::AbortedError(aborted_));
  turn_cv_.notify_all();
  return v1::Empty();
}

v1::StageInfo Stage::Impl::Info() const {
  v1::StageInfo info;
  info.set_version(CONVEYOR_VERSION);
  info.set_device(device_.str());
  info.set_threads(ComputeThreads());
  info.set_nccl(device_.is_cuda() && options_.transports->SupportsNccl());
  if (device_.is_cuda()) info.set_gpu_uuid(gpu_uuid_);
  info.set_checkpoint_dir(!options_.checkpoint_dir.empty());
  std::lock_guard<std::mutex> lock(info_mu_);
  info.set_job_id(job_id_);
  info.set_stage_index(stage_index_);
  info.set_replica(replica_);
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
  SetComputeThreads(options.threads > 0 ? options.threads : DefaultComputeThreads(options.device));
  auto impl = std::make_unique<Impl>(options, *device);
  RecordIdleStage(impl->Info().device());  // what a server without a job serves
  return std::unique_ptr<Stage>(new Stage(std::move(impl)));
}

Stage::Stage(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Stage::~Stage() { Shutdown(); }

namespace {
Status Stopped() { return absl::UnavailableError("the stage is shutting down"); }
}  // namespace

// kExecutor operations run on the executor, which owns the model; the
// kAnyThread ones (Abort, GetInfo) on the caller's thread.
#define CONVEYOR_STAGE_RUN_kExecutor(Name, Reply) \
  return impl_->executor().Run([&] { return impl_->Name(request); }, StatusOr<Reply>(Stopped()))
#define CONVEYOR_STAGE_RUN_kAnyThread(Name, Reply) return impl_->Name(request)
// kLaunch: launched on the executor in turn, ended on the caller's thread.
#define CONVEYOR_STAGE_RUN_kLaunch(Name, Reply)                                                                \
  CONVEYOR_RETURN_IF_ERROR(impl_->AwaitTurn(request));                                                       \
  auto launched = impl_->executor().Run([&] { return impl_->Launch##Name(request); },                       \
                                        StatusOr<Stage::Impl::StepEnd>(Stopped()));                           \
  if (!launched.ok()) return launched.status();                                                              \
  return impl_->Finish##Name(std::move(*launched))
#define CONVEYOR_STAGE_FORWARD(Name, Request, Reply, Thread, How) \
  StatusOr<Reply> Stage::Name(const Request& request) { CONVEYOR_STAGE_RUN_##Thread(Name, Reply); }
CONVEYOR_STAGE_CONTROL_OPS(CONVEYOR_STAGE_FORWARD)
#undef CONVEYOR_STAGE_FORWARD
#undef CONVEYOR_STAGE_RUN_kAnyThread
#undef CONVEYOR_STAGE_RUN_kLaunch
#undef CONVEYOR_STAGE_RUN_kExecutor

v1::StageInfo Stage::Info() const { return impl_->Info(); }
Inbox& Stage::inbox() { return impl_->inbox(); }

void Stage::Shutdown() {
  impl_->inbox().Fail(Stopped());
  impl_->executor().Shutdown();
  impl_->CloseLinks();
}

}  // namespace conveyor
