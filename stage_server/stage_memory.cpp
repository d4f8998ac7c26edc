// Out of memory is an answer, not a crash: a stage whose device (or host)
// cannot allocate fails the step with RESOURCE_EXHAUSTED saying what it held
// and what it asked for, frees the step's activations and the allocator's
// cache, and goes on serving (the coordinator releases the job).
#include <algorithm>
#include <new>

#include "model/out_of_memory.h"
#include "stage_server/stage_impl.h"

namespace conveyor {

void Stage::Impl::ReportMemory(v1::RunStepReply* reply) const {
  int64_t params = 0, grads = 0;
  if (job_) {
    for (const Chunk& c : job_->chunks) {
      for (const at::Tensor& p : c.layers->Parameters()) {
        params += Bytes(p);
        if (p.grad().defined()) grads += Bytes(p.grad());
      }
    }
  }
  reply->set_parameter_bytes(params);
  reply->set_gradient_bytes(grads);
  reply->set_optimizer_state_bytes(job_ && job_->optimizer ? OptimizerStateBytes(*job_->optimizer) : 0);
  if (device_.is_cuda()) reply->set_device_peak_bytes(std::max<int64_t>(0, CudaPeakAllocatedBytes(device_.str())));
}

std::string Stage::Impl::MemoryHeld(const StepState* st) const {
  v1::RunStepReply m;
  ReportMemory(&m);
  std::string held =
      "holding parameters " + ByteString(m.parameter_bytes()) + ", gradients " + ByteString(m.gradient_bytes());
  if (job_ && job_->optimizer) held += ", optimizer state " + ByteString(m.optimizer_state_bytes());
  if (st) {
    held += ", activations of " + std::to_string(st->held.size()) + " micro-batches in flight " +
            ByteString(st->held_bytes) + " (at most " + ByteString(st->peak_bytes) + " this step)";
  }
  if (device_.is_cuda()) {
    const int64_t reserved = CudaReservedBytes(device_.str());
    if (reserved >= 0) held += "; " + device_.str() + "'s caching allocator reserved " + ByteString(reserved);
  }
  return held;
}

Status Stage::Impl::TorchFailure(const std::exception& e, absl::StatusCode code, const std::string& context,
                                 const StepState* st) const {
  if (const auto* carried = dynamic_cast<const StatusError*>(&e)) return Annotate(carried->status(), context);
  if (!IsOutOfMemory(e)) return TorchErrorStatus(e, code, context);
  return TorchErrorStatus(e, code, context + " on " + device_.str(), MemoryHeld(st));
}

void Stage::Impl::FreeStep(StepState& st) {
  st.held.clear();
  st.held_bytes = 0;
  st.inputs = at::Tensor();
  st.labels = at::Tensor();
  st.loss_total = at::Tensor();
  if (device_.is_cuda()) EmptyCudaCache();
}

}  // namespace conveyor
