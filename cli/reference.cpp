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

StatusOr<ReferenceResult> TrainReference(const v1::JobSpec& job, const ReferenceOptions& options) {
  using Clock = std::chrono::steady_clock;
  CONVEYOR_RETURN_IF_ERROR(ValidateJobSpec(job));
  // A TorchScript model's layers and a data file's shapes, as stage 0 would
  // find them for the coordinator.
  v1::JobSpec spec = job;
  CONVEYOR_ASSIGN_OR_RETURN(v1::DescribeReply description, DescribeJob(spec));
  ApplyDescription(description, &spec);
  CONVEYOR_RETURN_IF_ERROR(ValidateJobSpec(spec));
  std::optional<at::Device> device;
  try {
    device.emplace(options.device);
  } catch (const c10::Error&) {
    return absl::InvalidArgumentError("unknown device '" + options.device + "'");
  }
  if (device->is_cuda() && !at::hasCUDA()) return absl::FailedPreconditionError("no CUDA device here");
  if (spec.precision() == v1::PRECISION_FP16_MIXED && !device->is_cuda()) {
    return absl::InvalidArgumentError("the reference is on " + device->str() +
                                      ": precision fp16-mixed needs a CUDA device (float16 autocast); use bf16-mixed");
  }
  CONVEYOR_ASSIGN_OR_RETURN(auto data, Dataset::Open(spec, true, true));
  // The model is built and initialised on the host with every core, whatever
  // the device trains with (one thread on CUDA by default).
  std::optional<AllCoresWhileBuilding> all_cores(std::in_place, device->is_cuda() && options.threads == 0);
  CONVEYOR_ASSIGN_OR_RETURN(std::unique_ptr<Partition> model, BuildPartition(spec, 0, NumLayers(spec.model())));
  if (!spec.init_from().empty()) {
    CONVEYOR_ASSIGN_OR_RETURN(NamedTensors weights, ReadStateDict(spec.init_from()));
    CONVEYOR_RETURN_IF_ERROR(CheckInitialWeightNames(spec, weights));
    CONVEYOR_RETURN_IF_ERROR(LoadInitialWeights(spec, weights, *model));
  }

  ReferenceResult result;
  v1::JobStatus& s = result.status;
  s.set_job_id("reference");
  s.set_name(spec.name());
  s.set_state(v1::JOB_STATE_RUNNING);
  s.set_schedule(v1::SCHEDULE_REFERENCE);
  s.set_batch_size(spec.batch_size());
  s.set_tokens(TokensPerSample(spec) > 0);
  s.set_micro_batches(1);
  const int accumulate = AccumulateSteps(spec);  // batches per optimizer step
  const int64_t per_epoch = data->StepsPerEpoch() / accumulate;
  if (per_epoch < 1) return absl::InvalidArgumentError("batch_size x accumulate_steps is larger than the training split");
  const int64_t total = spec.steps() > 0 ? spec.steps() : spec.epochs() * per_epoch;
  s.set_total_steps(total);
  s.set_total_epochs(spec.steps() > 0 ? static_cast<int>((total + per_epoch - 1) / per_epoch) : spec.epochs());
  try {
    model->To(*device);
    all_cores.reset();
    if (UsesChannelsLast(spec, *device)) ToChannelsLast(*model);
    if (device->is_cuda()) SetCudnnBenchmark(spec.cudnn_benchmark());
    if (spec.data().kind() == v1::DATA_TENSORS && data->train_size() > 0) {
      // A data file's class targets against the model's output, as the last
      // stage checks them when it is placed: one sample through the model.
      at::NoGradGuard no_grad;
      model->Train(false);
      const at::Tensor out = [&] {
        ForwardPrecision precision(spec, *device);
        return ValueOrThrow(model->ForwardOne(ToModel(spec, data->SampleOf(true).unsqueeze(0), *device)));
      }();
      model->Train(true);
      CONVEYOR_RETURN_IF_ERROR(data->CheckTargets(std::vector<int64_t>(out.sizes().begin() + 1, out.sizes().end())));
    }
    std::vector<at::Tensor> trainable;
    NamedTensors named;
    for (const auto& [name, p] : model->NamedParameters()) {
      if (!p.requires_grad()) continue;
      trainable.push_back(p);
      named.emplace_back(name, p);
    }
    auto optimizer = MakeOptimizer(spec.optimizer(), named);
    // cuda_graphs: each batch's forward, loss and backward replayed as a pair
    // of CUDA graphs from the second step on, as a one-stage server does
    // (GraphedPasses); the optimizer's few multi-tensor kernels run as they
    // are. The first step runs eagerly (lazy initialisation, kernel choices),
    // and so does a profiled one.
    // Left out of the job (auto), graphs are on where it allows them on a GPU.
    GraphsChoice graphs_choice = CudaGraphsFor(spec, /*reference=*/true);
    std::unique_ptr<GraphedPasses> graphs;
    if (graphs_choice.on && GraphedPasses::Available(*device)) graphs = std::make_unique<GraphedPasses>(*device);
    bool graphs_recorded = false;
    BatchLoader loader(spec, data.get(), *device, /*inputs=*/true, /*labels=*/true);
    model->Train(true);
    auto start = Clock::now();
    SteadyRate steady(std::min<int64_t>(kWarmupSteps, total - 1), spec.batch_size() * accumulate);
    // The test accuracy, as the coordinator's Evaluate() counts it.
    auto evaluate = [&] {
      at::NoGradGuard no_grad;
      model->Train(false);
      int64_t correct = 0, predictions = 0, samples = 0;
      double loss_weighted = 0;  // each batch's mean loss times its samples
      for (int64_t b = 0; b < data->EvalBatches(); ++b) {
        BatchLoader::Batch batch = loader.Get(v1::PHASE_EVAL, b);
        const at::Tensor out = [&] {
          ForwardPrecision precision(spec, *device);
          return ValueOrThrow(model->ForwardOne(batch.inputs));
        }();
        correct += CountCorrect(out, batch.labels);
        predictions += batch.labels.numel();
        const int64_t rows = batch.labels.size(0);
        loss_weighted += ComputeLoss(spec, out, batch.labels, 1.0).item<double>() * static_cast<double>(rows);
        samples += rows;
      }
      model->Train(true);
      s.set_has_eval(true);
      s.set_eval_loss(samples > 0 ? loss_weighted / static_cast<double>(samples) : 0);
      s.set_eval_accuracy(static_cast<double>(correct) / static_cast<double>(std::max<int64_t>(1, predictions)));
    };
    const bool by_epochs = spec.steps() == 0;
    const bool scaling = LossScaling(spec);
    LossScaleState loss_scale = InitialLossScale(spec);  // as the coordinator keeps it
    auto epoch_start = Clock::now();
    auto last_record = start;  // when the step before the one recorded was
    // A launched step's figures, still on the device.
    struct Launched {
      int64_t step = 0;
      double lr = 0;
      at::Tensor loss, sq;
    };
    // Reads them (the host waits for the device) and fails the run, as the
    // coordinator fails a pipelined job, where either is not finite (with
    // loss scaling an infinite norm only skips the step). `when` says what
    // had been launched by then.
    auto read = [&](const Launched& l, const std::string& when, double* norm, double* step_loss) -> absl::Status {
      *norm = l.sq.defined() ? std::sqrt(l.sq.item<double>()) : 0.0;
      *step_loss = l.loss.item<double>();
      if (std::isfinite(*step_loss) && (std::isfinite(*norm) || scaling)) return absl::OkStatus();
      return absl::FailedPreconditionError("step " + std::to_string(l.step + 1) + ": the " +
                                           (std::isfinite(*step_loss) ? "gradient norm" : "loss") +
                                           " is not finite; " + when);
    };
    // A read step in the summary: its figures, the clock, the epoch's end
    // (with its evaluation), the progress. `done`: the steps the device had
    // finished when the figures were read (one more than `step + 1` when the
    // next step was launched before the read, which waited for it too).
    auto record = [&](int64_t step, int64_t done, double lr, double norm, double step_loss) {
      s.add_lrs(lr);
      s.add_grad_norms(norm);
      s.add_losses(static_cast<float>(step_loss));
      s.set_loss(s.losses(s.losses_size() - 1));
      const auto now = Clock::now();
      const double elapsed = std::chrono::duration<double>(now - start).count();
      s.add_step_seconds(std::chrono::duration<double>(now - last_record).count());
      last_record = now;
      s.set_step(step + 1);
      s.set_epoch(static_cast<int>(step / per_epoch) + 1);
      s.set_elapsed_seconds(elapsed);
      s.set_samples_per_second(static_cast<double>((step + 1) * spec.batch_size() * accumulate) / elapsed);
      s.set_eta_seconds(elapsed / static_cast<double>(step + 1) * static_cast<double>(total - step - 1));
      steady.Mark(done, now);
      if (steady.steps() > 0) {
        s.set_steady_samples_per_second(steady.samples_per_second());
        s.set_steady_steps(steady.steps());
        s.set_steady_seconds(steady.seconds());
      }
      if (by_epochs && (step + 1) % per_epoch == 0) {  // as JobRunner::EndEpoch reports it
        const double seconds = std::chrono::duration<double>(Clock::now() - epoch_start).count();
        v1::EpochReport* e = s.add_epochs();
        *e = EpochSummary(s.losses(), step + 1, per_epoch, per_epoch, spec.batch_size() * accumulate, seconds);
        if (spec.eval()) {
          evaluate();
          e->set_has_eval(true);
          e->set_eval_accuracy(s.eval_accuracy());
          e->set_eval_loss(s.eval_loss());
        }
        epoch_start = Clock::now();
      }
      if (options.progress) options.progress(s);
    };
    std::optional<Launched> pending;  // the step launched before, not read yet
    auto finish = [&](const Launched& l, int64_t done, const std::string& when) -> absl::Status {
      double norm = 0, step_loss = 0;
      CONVEYOR_RETURN_IF_ERROR(read(l, when, &norm, &step_loss));
      record(l.step, done, l.lr, norm, step_loss);
      return absl::OkStatus();
    };
    for (int64_t step = 0; step < total; ++step) {
      std::unique_ptr<OpProfile> profile;
      if (spec.profile_step() == step + 1) {
        CONVEYOR_ASSIGN_OR_RETURN(profile, OpProfile::Start(device->is_cuda()));
      }
      bool graphed = graphs && (graphs_recorded || (step > 0 && spec.profile_step() != step + 1));
      const bool recording = graphed && !graphs_recorded;  // this step records each batch's pair
      if (graphs) {
        GraphedPasses::ZeroGrads(trainable);  // in place: a recorded graph has their addresses
      } else {
        optimizer->zero_grad();
      }
      at::Tensor loss;  // the mean over the step's batches
      for (int k = 0; k < accumulate; ++k) {
        const int64_t b = step * accumulate + k;
        BatchLoader::Batch batch = loader.Get(v1::PHASE_TRAIN, b);
        if (b + 1 < total * accumulate) loader.Prefetch(v1::PHASE_TRAIN, b + 1);  // while this batch is launched
        at::Tensor l;
        if (recording && k == 0) {
          // The eager first step left its activations' blocks cached in the
          // allocator, where a graph's private pool cannot reuse them: W2 at
          // batch 32 ran out of memory recording with 59 GiB cached (H100).
          EmptyCudaCache();
        }
        if (graphed) {  // no autocast, no loss scaling: cuda_graphs refuses both
          auto head = [&](const at::Tensor& out, const at::Tensor& labels) {
            return ComputeLoss(spec, out, labels, 1.0 / accumulate);
          };
          auto forwarded = graphs->Forward(0, k, *model, batch.inputs, false, batch.labels, head);
          Status backward = forwarded.ok() ? graphs->Backward(0, k, at::Tensor(), trainable).status() : forwarded.status();
          if (!backward.ok() && recording && !spec.has_cuda_graphs() &&
              backward.code() == absl::StatusCode::kResourceExhausted) {
            // auto chose graphs and recording them needs more memory than the
            // device has left: the job runs eagerly, as without them, and says so
            // (batches this step already replayed keep their gradients).
            graphs.reset();
            EmptyCudaCache();
            graphed = false;
            graphs_choice.why_off = "cuda_graphs (auto) off: recording them ran out of device memory (" +
                                    std::string(backward.message().substr(0, 200)) + "); the job ran eagerly";
          } else {
            if (!backward.ok()) throw StatusError(backward);
            l = forwarded->output;
            graphs_recorded = true;
            if (k == 0) ++result.graphed_steps;
          }
        }
        if (!graphed) {
          at::Tensor out;
          {
            ForwardPrecision precision(spec, *device);
            out = ValueOrThrow(model->ForwardOne(batch.inputs));
          }
          l = ComputeLoss(spec, out, batch.labels, 1.0 / accumulate);
          (scaling ? l * loss_scale.scale : l).backward();
        }
        // A graph's loss is its output buffer, which the next replay
        // overwrites: the step keeps a copy until it is read.
        at::Tensor own = graphed ? l.detach().clone() : l.detach();
        loss = loss.defined() ? loss + own : own;
      }
      const double lr = LearningRate(spec, step, total);
      SetLearningRate(*optimizer, lr);
      if (scaling) ScaleGrads(trainable, 1 / loss_scale.scale);  // unscaled
      for (const v1::InfGradient& g : spec.inject_inf_gradients()) {  // a test's overflow: any stage's is the model's
        if (g.step() == step && !trainable.empty() && trainable.front().grad().defined())
          trainable.front().grad().view(-1)[0].fill_(std::numeric_limits<double>::infinity());
      }
      // On CUDA without loss scaling nothing needs the loss or the norm on the
      // host before the update: the whole step is launched first.
      const bool read_after_update = (device->is_cuda() || options.defer_reads) && !scaling;
      const at::Tensor sq = GradSquaredNormTensor(trainable);
      if (read_after_update) {
        if (spec.clip_grad_norm() > 0) ClipGradsOnDevice(trainable, spec.clip_grad_norm(), sq);
        optimizer->step();
      }
      // On CUDA without loss scaling a step's loss and norm are read once the
      // next step is launched behind it, so the device does not wait for the
      // host between steps. Not at an epoch's end (its clock, its evaluation
      // of these weights), at the last step or at a profiled one.
      if (pending) {
        CONVEYOR_RETURN_IF_ERROR(
            finish(*pending, step + 1, "found after its update and the next step's were launched on the GPU"));
        pending.reset();
      }
      Launched launched{step, lr, loss, sq};
      const bool epoch_end = by_epochs && (step + 1) % per_epoch == 0;
      if (read_after_update && !profile && !epoch_end && step + 1 < total) {
        pending = std::move(launched);
        continue;
      }
      double norm = 0, step_loss = 0;
      const char* when = read_after_update ? "found after its update was launched on the GPU" : "no update was made";
      CONVEYOR_RETURN_IF_ERROR(read(launched, when, &norm, &step_loss));
      const bool found_inf = scaling && !std::isfinite(norm);  // the step is skipped
      if (!found_inf && !read_after_update) {
        if (spec.clip_grad_norm() > 0) ScaleGrads(trainable, ClipFactor(spec.clip_grad_norm(), norm));
        optimizer->step();
      }
      if (scaling) {
        s.add_loss_scales(loss_scale.scale);
        UpdateLossScale(spec, found_inf, &loss_scale);
      }
      if (profile) {
        CONVEYOR_RETURN_IF_ERROR(profile->Finish(ProfilePath(options.profile_dir, "reference", step + 1, "reference")));
      }
      record(step, step + 1, lr, norm, step_loss);
    }
    if (spec.eval() && !by_epochs) evaluate();
    // What became of cuda_graphs, said once: asked for or chosen, and where
    // auto chose no graphs on a GPU, why.
    std::string said;
    if (graphs) {
      said = std::to_string(result.graphed_steps) + " of " + std::to_string(total) + " steps replayed as CUDA graphs";
    } else if (spec.has_cuda_graphs() && spec.cuda_graphs()) {
      said = "cuda_graphs ignored on " + device->str();
    } else if (device->is_cuda() && !spec.has_cuda_graphs()) {
      said = graphs_choice.why_off;  // auto's reason, or that recording ran out of memory
    }
    if (!said.empty()) {
      v1::JobEvent* e = s.add_events();
      e->set_unix_ms(std::chrono::duration_cast<std::chrono::milliseconds>(
                         std::chrono::system_clock::now().time_since_epoch()).count());
      e->set_text(said);
    }
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
  std::vector<std::string> digests;
  for (int i = 0; i < model->num_layers(); ++i) digests.push_back(model->LayerDigest(i));
  s.set_param_digest(CombineDigests(digests));
  for (auto& [name, t] : model->NamedParameters()) result.parameters.emplace_back(name, t.detach().to(at::kCPU));
  for (auto& [name, t] : model->NamedBuffers()) result.buffers.emplace_back(name, t.detach().to(at::kCPU));
  if (!spec.save_path().empty()) {
    NamedTensors all = result.parameters;
    all.insert(all.end(), result.buffers.begin(), result.buffers.end());
    CONVEYOR_RETURN_IF_ERROR(WriteWeights(spec.save_path(), all, spec.model(),
                                          spec.save_format() == v1::SAVE_FORMAT_TORCHSCRIPT, "save.path"));
  }
  s.set_state(v1::JOB_STATE_SUCCEEDED);
  s.set_eta_seconds(0);
  return result;
}

StatusOr<v1::JobStatus> RunReference(const v1::JobSpec& spec, const ReferenceOptions& options) {
  SetComputeThreads(options.threads > 0 ? options.threads : DefaultComputeThreads(options.device));
  auto result = TrainReference(spec, options);
  if (!result.ok()) return result.status();
  return std::move(result->status);
}

}  // namespace conveyor::cli
