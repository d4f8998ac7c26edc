#include "cli/reference.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/optim/optimizer.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <optional>

#include "common/steady_rate.h"
#include "model/dataset.h"
#include "model/device.h"
#include "common/sha256.h"
#include "plan/job_spec.h"
#include "plan/lr_schedule.h"
#include "plan/model_catalog.h"
#include "model/models.h"
#include "model/op_profile.h"
#include "stage_server/device_info.h"
#include "stage_server/graphed_passes.h"
#include "model/optimizer.h"
#include "model/out_of_memory.h"
#include "model/training.h"
#include "model/partition.h"
#include "model/state_dict.h"
#include "model/torchscript_export.h"

namespace conveyor::cli {

namespace {

using ReferenceClock = std::chrono::steady_clock;

// The job as the reference trains it: a TorchScript model's layers and a data
// file's shapes filled in, as stage 0 would find them for the coordinator.
StatusOr<v1::JobSpec> ReferenceDescribedJob(const v1::JobSpec& job) {
  CONVEYOR_RETURN_IF_ERROR(ValidateJobSpec(job));
  v1::JobSpec spec = job;
  CONVEYOR_ASSIGN_OR_RETURN(v1::DescribeReply description, DescribeJob(spec));
  ApplyDescription(description, &spec);
  CONVEYOR_RETURN_IF_ERROR(ValidateJobSpec(spec));
  return spec;
}

// The device `name` names, where this host has it and the job's precision
// can run on it.
StatusOr<at::Device> ReferenceDevice(const v1::JobSpec& spec, const std::string& name) {
  std::optional<at::Device> device;
  try {
    device.emplace(name);
  } catch (const c10::Error&) {
    return absl::InvalidArgumentError("unknown device '" + name + "'");
  }
  if (device->is_cuda() && !at::hasCUDA()) return absl::FailedPreconditionError("no CUDA device here");
  if (spec.precision() == v1::PRECISION_FP16_MIXED && !device->is_cuda()) {
    return absl::InvalidArgumentError("the reference is on " + device->str() +
                                      ": precision fp16-mixed needs a CUDA device (float16 autocast); use bf16-mixed");
  }
  return *device;
}

// The model on the host, with init_from's weights where the job names them.
StatusOr<std::unique_ptr<Partition>> ReferenceBuildModel(const v1::JobSpec& spec) {
  CONVEYOR_ASSIGN_OR_RETURN(std::unique_ptr<Partition> model, BuildPartition(spec, 0, NumLayers(spec.model())));
  if (!spec.init_from().empty()) {
    CONVEYOR_ASSIGN_OR_RETURN(NamedTensors weights, ReadStateDict(spec.init_from()));
    CONVEYOR_RETURN_IF_ERROR(CheckInitialWeightNames(spec, weights));
    CONVEYOR_RETURN_IF_ERROR(LoadInitialWeights(spec, weights, *model));
  }
  return model;
}

// How many steps the run takes, and how they group into batches and epochs.
struct ReferenceSteps {
  int accumulate = 1;     // batches per optimizer step
  int64_t per_epoch = 0;  // optimizer steps per epoch
  int64_t total = 0;
};

// The status a pipelined job would start with, its step and epoch totals
// set; fails where one optimizer step needs more than the training split.
StatusOr<ReferenceSteps> ReferenceStartStatus(const v1::JobSpec& spec, const Dataset& data, v1::JobStatus* s) {
  s->set_job_id("reference");
  s->set_name(spec.name());
  s->set_state(v1::JOB_STATE_RUNNING);
  s->set_schedule(v1::SCHEDULE_REFERENCE);
  s->set_batch_size(spec.batch_size());
  s->set_tokens(TokensPerSample(spec) > 0);
  s->set_micro_batches(1);
  ReferenceSteps steps;
  steps.accumulate = AccumulateSteps(spec);
  steps.per_epoch = data.StepsPerEpoch() / steps.accumulate;
  if (steps.per_epoch < 1)
    return absl::InvalidArgumentError("batch_size x accumulate_steps is larger than the training split");
  steps.total = spec.steps() > 0 ? spec.steps() : spec.epochs() * steps.per_epoch;
  s->set_total_steps(steps.total);
  s->set_total_epochs(spec.steps() > 0 ? static_cast<int>((steps.total + steps.per_epoch - 1) / steps.per_epoch)
                                       : spec.epochs());
  return steps;
}

// A data file's class targets against the model's output, as the last stage
// checks them when it is placed: one sample through the model.
Status ReferenceCheckTargets(const v1::JobSpec& spec, const at::Device& device, Dataset& data, Partition& model) {
  if (spec.data().kind() != v1::DATA_TENSORS || data.train_size() <= 0) return absl::OkStatus();
  at::NoGradGuard no_grad;
  model.Train(false);
  const at::Tensor out = [&] {
    ForwardPrecision precision(spec, device);
    return ValueOrThrow(model.ForwardOne(ToModel(spec, data.SampleOf(true).unsqueeze(0), device)));
  }();
  model.Train(true);
  return data.CheckTargets(std::vector<int64_t>(out.sizes().begin() + 1, out.sizes().end()));
}

// The training loop, step by step, with the status a pipelined job reports
// kept as it goes.
class ReferenceLoop {
 public:
  ReferenceLoop(const v1::JobSpec& spec, const ReferenceOptions& options, const at::Device& device, Dataset* data,
                Partition* model, ReferenceSteps steps, ReferenceResult* result);

  // Every step, then the evaluation a job by steps has at its end and what
  // became of cuda_graphs. Torch's errors are thrown.
  Status Run();

 private:
  // A launched step's figures, still on the device.
  struct Launched {
    int64_t step = 0;
    double lr = 0;
    at::Tensor loss, sq;
  };

  Status Step(int64_t step);
  at::Tensor ForwardBackward(int64_t step, bool graphed, bool recording);
  at::Tensor GraphedBatch(int k, const BatchLoader::Batch& batch, bool recording, bool* graphed);
  at::Tensor EagerBatch(const BatchLoader::Batch& batch);
  void PrepareUpdate(int64_t step, double lr);
  Status ReadAndUpdate(const Launched& launched, bool read_after_update, OpProfile* profile);
  Status Read(const Launched& l, const std::string& when, double* norm, double* step_loss) const;
  void Record(int64_t step, int64_t done, double lr, double norm, double step_loss);
  Status Finish(const Launched& l, int64_t done, const std::string& when);
  void Evaluate();
  void SayCudaGraphs();

  const v1::JobSpec& spec_;
  const ReferenceOptions& options_;
  const at::Device device_;
  Dataset* const data_;
  Partition* const model_;
  const ReferenceSteps steps_;
  ReferenceResult* const result_;
  v1::JobStatus& s_;
  std::vector<at::Tensor> trainable_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  GraphsChoice graphs_choice_;
  std::unique_ptr<GraphedPasses> graphs_;
  bool graphs_recorded_ = false;
  std::unique_ptr<BatchLoader> loader_;
  ReferenceClock::time_point start_;
  SteadyRate steady_;
  const bool by_epochs_;
  const bool scaling_;
  LossScaleState loss_scale_;  // as the coordinator keeps it
  ReferenceClock::time_point epoch_start_;
  ReferenceClock::time_point last_record_;  // when the step before the one recorded was
  std::optional<Launched> pending_;         // the step launched before, not read yet
};

ReferenceLoop::ReferenceLoop(const v1::JobSpec& spec, const ReferenceOptions& options, const at::Device& device,
                             Dataset* data, Partition* model, ReferenceSteps steps, ReferenceResult* result)
    : spec_(spec),
      options_(options),
      device_(device),
      data_(data),
      model_(model),
      steps_(steps),
      result_(result),
      s_(result->status),
      steady_(std::min<int64_t>(kWarmupSteps, steps.total - 1), spec.batch_size() * steps.accumulate),
      by_epochs_(spec.steps() == 0),
      scaling_(LossScaling(spec)),
      loss_scale_(InitialLossScale(spec)) {
  NamedTensors named;
  for (const auto& [name, p] : model_->NamedParameters()) {
    if (!p.requires_grad()) continue;
    trainable_.push_back(p);
    named.emplace_back(name, p);
  }
  optimizer_ = MakeOptimizer(spec_.optimizer(), named);
  // cuda_graphs: each batch's forward, loss and backward replayed as a pair
  // of CUDA graphs from the second step on, as a one-stage server does
  // (GraphedPasses); the optimizer's few multi-tensor kernels run as they
  // are. The first step runs eagerly (lazy initialisation, kernel choices),
  // and so does a profiled one.
  // Left out of the job (auto), graphs are on where it allows them on a GPU.
  graphs_choice_ = CudaGraphsFor(spec_, /*reference=*/true);
  if (graphs_choice_.on && GraphedPasses::Available(device_)) graphs_ = std::make_unique<GraphedPasses>(device_);
  loader_ = std::make_unique<BatchLoader>(spec_, data_, device_, /*inputs=*/true, /*labels=*/true);
  model_->Train(true);
  start_ = ReferenceClock::now();
  epoch_start_ = ReferenceClock::now();
  last_record_ = start_;
}

Status ReferenceLoop::Run() {
  for (int64_t step = 0; step < steps_.total; ++step) {
    CONVEYOR_RETURN_IF_ERROR(Step(step));
  }
  if (spec_.eval() && !by_epochs_) Evaluate();
  SayCudaGraphs();
  return absl::OkStatus();
}

Status ReferenceLoop::Step(int64_t step) {
  std::unique_ptr<OpProfile> profile;
  if (spec_.profile_step() == step + 1) {
    CONVEYOR_ASSIGN_OR_RETURN(profile, OpProfile::Start(device_.is_cuda()));
  }
  const bool graphed = graphs_ && (graphs_recorded_ || (step > 0 && spec_.profile_step() != step + 1));
  const bool recording = graphed && !graphs_recorded_;  // this step records each batch's pair
  if (graphs_) {
    GraphedPasses::ZeroGrads(trainable_);  // in place: a recorded graph has their addresses
  } else {
    optimizer_->zero_grad();
  }
  const at::Tensor loss = ForwardBackward(step, graphed, recording);
  const double lr = LearningRate(spec_, step, steps_.total);
  PrepareUpdate(step, lr);
  // On CUDA without loss scaling nothing needs the loss or the norm on the
  // host before the update: the whole step is launched first.
  const bool read_after_update = (device_.is_cuda() || options_.defer_reads) && !scaling_;
  const at::Tensor sq = GradSquaredNormTensor(trainable_);
  if (read_after_update) {
    if (spec_.clip_grad_norm() > 0) ClipGradsOnDevice(trainable_, spec_.clip_grad_norm(), sq);
    optimizer_->step();
  }
  // On CUDA without loss scaling a step's loss and norm are read once the
  // next step is launched behind it, so the device does not wait for the
  // host between steps. Not at an epoch's end (its clock, its evaluation
  // of these weights), at the last step or at a profiled one.
  if (pending_) {
    CONVEYOR_RETURN_IF_ERROR(
        Finish(*pending_, step + 1, "found after its update and the next step's were launched on the GPU"));
    pending_.reset();
  }
  Launched launched{step, lr, loss, sq};
  const bool epoch_end = by_epochs_ && (step + 1) % steps_.per_epoch == 0;
  if (read_after_update && !profile && !epoch_end && step + 1 < steps_.total) {
    pending_ = std::move(launched);
    return absl::OkStatus();
  }
  return ReadAndUpdate(launched, read_after_update, profile.get());
}

// The step's batches forward and backward, their gradients accumulated; the
// mean of their losses.
at::Tensor ReferenceLoop::ForwardBackward(int64_t step, bool graphed, bool recording) {
  at::Tensor loss;
  for (int k = 0; k < steps_.accumulate; ++k) {
    const int64_t b = step * steps_.accumulate + k;
    BatchLoader::Batch batch = loader_->Get(v1::PHASE_TRAIN, b);
    if (b + 1 < steps_.total * steps_.accumulate) loader_->Prefetch(v1::PHASE_TRAIN, b + 1);  // while this batch is launched
    at::Tensor l;
    if (recording && k == 0) {
      // The eager first step left its activations' blocks cached in the
      // allocator, where a graph's private pool cannot reuse them: W2 at
      // batch 32 ran out of memory recording with 59 GiB cached (H100).
      EmptyCudaCache();
    }
    if (graphed) l = GraphedBatch(k, batch, recording, &graphed);
    if (!graphed) l = EagerBatch(batch);
    // A graph's loss is its output buffer, which the next replay
    // overwrites: the step keeps a copy until it is read.
    at::Tensor own = graphed ? l.detach().clone() : l.detach();
    loss = loss.defined() ? loss + own : own;
  }
  return loss;
}

// Batch `k`'s forward, loss and backward as a replayed pair of CUDA graphs
// (no autocast, no loss scaling: cuda_graphs refuses both); its loss. Where
// the graphs are given up, `*graphed` turns false and the loss is undefined.
at::Tensor ReferenceLoop::GraphedBatch(int k, const BatchLoader::Batch& batch, bool recording, bool* graphed) {
  auto head = [&](const at::Tensor& out, const at::Tensor& labels) {
    return ComputeLoss(spec_, out, labels, 1.0 / steps_.accumulate);
  };
  auto forwarded = graphs_->Forward(0, k, *model_, batch.inputs, false, batch.labels, head);
  Status backward = forwarded.ok() ? graphs_->Backward(0, k, at::Tensor(), trainable_).status() : forwarded.status();
  if (!backward.ok() && recording && !spec_.has_cuda_graphs() &&
      backward.code() == absl::StatusCode::kResourceExhausted) {
    // auto chose graphs and recording them needs more memory than the
    // device has left: the job runs eagerly, as without them, and says so
    // (batches this step already replayed keep their gradients).
    graphs_.reset();
    EmptyCudaCache();
    *graphed = false;
    graphs_choice_.why_off = "cuda_graphs (auto) off: recording them ran out of device memory (" +
                             std::string(backward.message().substr(0, 200)) + "); the job ran eagerly";
    return at::Tensor();
  }
  if (!backward.ok()) throw StatusError(backward);
  at::Tensor l = forwarded->output;
  graphs_recorded_ = true;
  if (k == 0) ++result_->graphed_steps;
  return l;
}

// A batch's forward (under the job's precision), loss and backward, run
// eagerly; its loss.
at::Tensor ReferenceLoop::EagerBatch(const BatchLoader::Batch& batch) {
  at::Tensor out;
  {
    ForwardPrecision precision(spec_, device_);
    out = ValueOrThrow(model_->ForwardOne(batch.inputs));
  }
  at::Tensor l = ComputeLoss(spec_, out, batch.labels, 1.0 / steps_.accumulate);
  (scaling_ ? l * loss_scale_.scale : l).backward();
  return l;
}

// The step's learning rate set, its gradients unscaled, and a test's
// overflow injected, before the norm is taken.
void ReferenceLoop::PrepareUpdate(int64_t step, double lr) {
  SetLearningRate(*optimizer_, lr);
  if (scaling_) ScaleGrads(trainable_, 1 / loss_scale_.scale);  // unscaled
  for (const v1::InfGradient& g : spec_.inject_inf_gradients()) {  // a test's overflow: any stage's is the model's
    if (g.step() == step && !trainable_.empty() && trainable_.front().grad().defined())
      trainable_.front().grad().view(-1)[0].fill_(std::numeric_limits<double>::infinity());
  }
}

// A step read at once: its figures, then (where not made already) its
// update, the loss scale's, the profile's trace and its record.
Status ReferenceLoop::ReadAndUpdate(const Launched& launched, bool read_after_update, OpProfile* profile) {
  double norm = 0, step_loss = 0;
  const char* when = read_after_update ? "found after its update was launched on the GPU" : "no update was made";
  CONVEYOR_RETURN_IF_ERROR(Read(launched, when, &norm, &step_loss));
  const bool found_inf = scaling_ && !std::isfinite(norm);  // the step is skipped
  if (!found_inf && !read_after_update) {
    if (spec_.clip_grad_norm() > 0) ScaleGrads(trainable_, ClipFactor(spec_.clip_grad_norm(), norm));
    optimizer_->step();
  }
  if (scaling_) {
    s_.add_loss_scales(loss_scale_.scale);
    UpdateLossScale(spec_, found_inf, &loss_scale_);
  }
  if (profile) {
    CONVEYOR_RETURN_IF_ERROR(
        profile->Finish(ProfilePath(options_.profile_dir, "reference", launched.step + 1, "reference")));
  }
  Record(launched.step, launched.step + 1, launched.lr, norm, step_loss);
  return absl::OkStatus();
}

// Reads a launched step's figures (the host waits for the device) and fails
// the run, as the coordinator fails a pipelined job, where either is not
// finite (with loss scaling an infinite norm only skips the step). `when`
// says what had been launched by then.
Status ReferenceLoop::Read(const Launched& l, const std::string& when, double* norm, double* step_loss) const {
  *norm = l.sq.defined() ? std::sqrt(l.sq.item<double>()) : 0.0;
  *step_loss = l.loss.item<double>();
  if (std::isfinite(*step_loss) && (std::isfinite(*norm) || scaling_)) return absl::OkStatus();
  return absl::FailedPreconditionError("step " + std::to_string(l.step + 1) + ": the " +
                                       (std::isfinite(*step_loss) ? "gradient norm" : "loss") +
                                       " is not finite; " + when);
}

// A read step in the summary: its figures, the clock, the epoch's end
// (with its evaluation), the progress. `done`: the steps the device had
// finished when the figures were read (one more than `step + 1` when the
// next step was launched before the read, which waited for it too).
void ReferenceLoop::Record(int64_t step, int64_t done, double lr, double norm, double step_loss) {
  s_.add_lrs(lr);
  s_.add_grad_norms(norm);
  s_.add_losses(static_cast<float>(step_loss));
  s_.set_loss(s_.losses(s_.losses_size() - 1));
  const auto now = ReferenceClock::now();
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  s_.add_step_seconds(std::chrono::duration<double>(now - last_record_).count());
  last_record_ = now;
  s_.set_step(step + 1);
  s_.set_epoch(static_cast<int>(step / steps_.per_epoch) + 1);
  s_.set_elapsed_seconds(elapsed);
  s_.set_samples_per_second(static_cast<double>((step + 1) * spec_.batch_size() * steps_.accumulate) / elapsed);
  s_.set_eta_seconds(elapsed / static_cast<double>(step + 1) * static_cast<double>(steps_.total - step - 1));
  steady_.Mark(done, now);
  if (steady_.steps() > 0) {
    s_.set_steady_samples_per_second(steady_.samples_per_second());
    s_.set_steady_steps(steady_.steps());
    s_.set_steady_seconds(steady_.seconds());
  }
  if (by_epochs_ && (step + 1) % steps_.per_epoch == 0) {  // as JobRunner::EndEpoch reports it
    const double seconds = std::chrono::duration<double>(ReferenceClock::now() - epoch_start_).count();
    v1::EpochReport* e = s_.add_epochs();
    *e = EpochSummary(s_.losses(), step + 1, steps_.per_epoch, steps_.per_epoch,
                      spec_.batch_size() * steps_.accumulate, seconds);
    if (spec_.eval()) {
      Evaluate();
      e->set_has_eval(true);
      e->set_eval_accuracy(s_.eval_accuracy());
      e->set_eval_loss(s_.eval_loss());
    }
    epoch_start_ = ReferenceClock::now();
  }
  if (options_.progress) options_.progress(s_);
}

// The step launched before, read now and recorded.
Status ReferenceLoop::Finish(const Launched& l, int64_t done, const std::string& when) {
  double norm = 0, step_loss = 0;
  CONVEYOR_RETURN_IF_ERROR(Read(l, when, &norm, &step_loss));
  Record(l.step, done, l.lr, norm, step_loss);
  return absl::OkStatus();
}

// The test accuracy, as the coordinator's Evaluate() counts it.
void ReferenceLoop::Evaluate() {
  at::NoGradGuard no_grad;
  model_->Train(false);
  int64_t correct = 0, predictions = 0, samples = 0;
  double loss_weighted = 0;  // each batch's mean loss times its samples
  for (int64_t b = 0; b < data_->EvalBatches(); ++b) {
    BatchLoader::Batch batch = loader_->Get(v1::PHASE_EVAL, b);
    const at::Tensor out = [&] {
      ForwardPrecision precision(spec_, device_);
      return ValueOrThrow(model_->ForwardOne(batch.inputs));
    }();
    correct += CountCorrect(out, batch.labels);
    predictions += batch.labels.numel();
    const int64_t rows = batch.labels.size(0);
    loss_weighted += ComputeLoss(spec_, out, batch.labels, 1.0).item<double>() * static_cast<double>(rows);
    samples += rows;
  }
  model_->Train(true);
  s_.set_has_eval(true);
  s_.set_eval_loss(samples > 0 ? loss_weighted / static_cast<double>(samples) : 0);
  s_.set_eval_accuracy(static_cast<double>(correct) / static_cast<double>(std::max<int64_t>(1, predictions)));
}

// What became of cuda_graphs, said once: asked for or chosen, and where
// auto chose no graphs on a GPU, why.
void ReferenceLoop::SayCudaGraphs() {
  std::string said;
  if (graphs_) {
    said = std::to_string(result_->graphed_steps) + " of " + std::to_string(steps_.total) +
           " steps replayed as CUDA graphs";
  } else if (spec_.has_cuda_graphs() && spec_.cuda_graphs()) {
    said = "cuda_graphs ignored on " + device_.str();
  } else if (device_.is_cuda() && !spec_.has_cuda_graphs()) {
    said = graphs_choice_.why_off;  // auto's reason, or that recording ran out of memory
  }
  if (said.empty()) return;
  v1::JobEvent* e = s_.add_events();
  e->set_unix_ms(std::chrono::duration_cast<std::chrono::milliseconds>(
                     std::chrono::system_clock::now().time_since_epoch()).count());
  e->set_text(said);
}

// The trained weights, on the CPU, and their digest in the status; written
// to save.path where the job names one.
Status ReferenceKeepWeights(const v1::JobSpec& spec, Partition& model, ReferenceResult* result) {
  std::vector<std::string> digests;
  for (int i = 0; i < model.num_layers(); ++i) digests.push_back(model.LayerDigest(i));
  result->status.set_param_digest(CombineDigests(digests));
  for (auto& [name, t] : model.NamedParameters()) result->parameters.emplace_back(name, t.detach().to(at::kCPU));
  for (auto& [name, t] : model.NamedBuffers()) result->buffers.emplace_back(name, t.detach().to(at::kCPU));
  if (spec.save_path().empty()) return absl::OkStatus();
  NamedTensors all = result->parameters;
  all.insert(all.end(), result->buffers.begin(), result->buffers.end());
  return WriteWeights(spec.save_path(), all, spec.model(), spec.save_format() == v1::SAVE_FORMAT_TORCHSCRIPT,
                      "save.path");
}

}  // namespace

StatusOr<ReferenceResult> TrainReference(const v1::JobSpec& job, const ReferenceOptions& options) {
  CONVEYOR_ASSIGN_OR_RETURN(const v1::JobSpec spec, ReferenceDescribedJob(job));
  CONVEYOR_ASSIGN_OR_RETURN(const at::Device device, ReferenceDevice(spec, options.device));
  CONVEYOR_ASSIGN_OR_RETURN(auto data, Dataset::Open(spec, true, true));
  // The model is built and initialised on the host with every core, whatever
  // the device trains with (one thread on CUDA by default).
  std::optional<AllCoresWhileBuilding> all_cores(std::in_place, device.is_cuda() && options.threads == 0);
  CONVEYOR_ASSIGN_OR_RETURN(std::unique_ptr<Partition> model, ReferenceBuildModel(spec));

  ReferenceResult result;
  CONVEYOR_ASSIGN_OR_RETURN(const ReferenceSteps steps, ReferenceStartStatus(spec, *data, &result.status));
  try {
    model->To(device);
    all_cores.reset();
    if (UsesChannelsLast(spec, device)) ToChannelsLast(*model);
    if (device.is_cuda()) SetCudnnBenchmark(spec.cudnn_benchmark());
    CONVEYOR_RETURN_IF_ERROR(ReferenceCheckTargets(spec, device, *data, *model));
    ReferenceLoop loop(spec, options, device, data.get(), model.get(), steps, &result);
    CONVEYOR_RETURN_IF_ERROR(loop.Run());
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    // A loss of the user's that returned no scalar (ComputeLoss says so) is
    // bad input; the stages find it when the job is placed (CheckLoss).
    if (what.rfind("loss.torchscript: ", 0) == 0)
      return absl::InvalidArgumentError("reference training: " + what.substr(0, what.find('\n')));
    return TorchErrorStatus(e, absl::StatusCode::kInternal, "reference training");
  } catch (const std::bad_alloc& e) {
    return TorchErrorStatus(e, absl::StatusCode::kInternal, "reference training");
  } catch (const StatusError& e) {
    return Annotate(e.status(), "reference training");
  }
  CONVEYOR_RETURN_IF_ERROR(ReferenceKeepWeights(spec, *model, &result));
  result.status.set_state(v1::JOB_STATE_SUCCEEDED);
  result.status.set_eta_seconds(0);
  return result;
}

StatusOr<v1::JobStatus> RunReference(const v1::JobSpec& spec, const ReferenceOptions& options) {
  SetComputeThreads(options.threads > 0 ? options.threads : DefaultComputeThreads(options.device));
  auto result = TrainReference(spec, options);
  if (!result.ok()) return result.status();
  return std::move(result->status);
}

}  // namespace conveyor::cli
