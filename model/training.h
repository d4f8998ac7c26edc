// The arithmetic of a training step that both the stages and the reference
// share: loss, accuracy and batches, built from the job spec (the optimizer:
// optimizer.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <c10/core/Device.h>

#include <cstdint>
#include <future>
#include <memory>
#include <optional>
#include <vector>

#include "common/status.h"
#include "conveyor.pb.h"
#include "model/compat.h"
#include "model/side_stream.h"

namespace conveyor {

// The loss of one micro-batch scaled by `scale` (its share of the mini-batch),
// so that the sum over micro-batches is the mini-batch's mean loss. Logits
// [B, C] or [B, T, C] (sequences: every token counts). With
// loss: {torchscript: PATH}, the module's forward(output, target) as it is
// (bf16 outputs upcast to fp32); it must return a floating-point scalar, the
// mean over its batch, else a c10::Error names the file and what it gave.
at::Tensor ComputeLoss(const v1::JobSpec& spec, const at::Tensor& logits,
                       const at::Tensor& labels, double scale);

// loss: {torchscript: PATH}, on the stage that computes the loss when the
// job is placed: loads the module (once per process and path; ComputeLoss
// runs it) and runs it on two samples of zeros, outputs of
// `output_sample_shape` and targets as the data gives them. NOT_FOUND for a
// missing file; INVALID_ARGUMENT for one that is not TorchScript, has no
// forward, fails on such inputs or returns no scalar. OK for built-in losses.
Status CheckLoss(const v1::JobSpec& spec, const std::vector<int64_t>& output_sample_shape);

// What a forward runs under, as long as it lives: with precision: bf16-mixed,
// autocast in bfloat16 on `device`'s type (model/compat.h) (fp16-mixed: in
// float16), the parameters
// staying fp32; otherwise nothing. Backward passes run outside it, as they
// do outside torch.autocast.
class ForwardPrecision {
 public:
  ForwardPrecision(const v1::JobSpec& spec, const at::Device& device);

 private:
  std::optional<AutocastGuard> autocast_;
};

// Correct predictions: one per sample, or one per token of a sequence.
int64_t CountCorrect(const at::Tensor& logits, const at::Tensor& labels);

// A batch of model inputs on `device`, floating inputs in the job's precision.
at::Tensor ToModel(const v1::JobSpec& spec, const at::Tensor& inputs, const at::Device& device);

class Dataset;

// The mini-batches a stage (or the reference) reads, on its device. On a CUDA
// device Prefetch() starts gathering a later step's batch into pinned host
// memory on a thread of its own, while this thread launches the current
// step; that thread then queues its copy to the device (and the conversions
// to the job's precision and memory format) on a side stream, which the
// copy engine runs beside the step's kernels, and Get() makes the compute
// stream wait for it: neither the device nor the launching thread waits for
// the host's gather, a pageable copy or the transfer itself. Same tensors,
// same order: only when and where the work is done changes.
class BatchLoader {
 public:
  struct Batch {
    at::Tensor inputs, labels;  // on the device; undefined when not read
  };
  // `data` is not owned and outlives the loader.
  BatchLoader(const v1::JobSpec& spec, Dataset* data, const at::Device& device, bool inputs, bool labels);

  Batch Get(v1::Phase phase, int64_t step);
  // Starts gathering (phase, step) for a later Get(); a no-op off CUDA.
  void Prefetch(v1::Phase phase, int64_t step);
  ~BatchLoader();

 private:
  Batch Gather(v1::Phase phase, int64_t step) const;  // on the host
  Batch ToDevice(const Batch& host) const;             // queued on the current stream

  const v1::JobSpec& spec_;
  Dataset* data_;
  const at::Device device_;
  const bool inputs_, labels_;
  const bool channels_last_;  // 4-D inputs converted on the device (memory_format)
  struct Loaded {
    Batch batch;                           // on the device
    std::unique_ptr<SideStreamWork> copy;  // what the compute stream waits for; null: nothing
  };
  struct Ahead {
    v1::Phase phase;
    int64_t step;
    std::future<Loaded> batch;
  };
  std::optional<Ahead> ahead_;
};

}  // namespace conveyor
