// A stage's inbox: tensors that neighbours pushed, checked on arrival, held
// until the stage's schedule takes them. A frame is a header and an opaque
// payload (frame.h); headers whose bytes come over NCCL are checked, then
// handed to the fetcher registered for their kind, which delivers the whole
// frame once its bytes are here.
//
// Torch-free (the receive path of the gRPC stream and the fuzz targets use it).
// Thread-safe: Deliver() is called from transport threads, Take() from the
// stage's executor, Fail() from anywhere.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "conveyor.pb.h"
#include "transport/frame.h"

namespace conveyor {

// One tensor of what crosses into a chunk, per sample.
struct ExpectedTensor {
  v1::DType dtype = v1::DTYPE_FLOAT32;
  std::vector<int64_t> sample_shape;
};

// What the inbox accepts while a job is configured.
struct InboxExpectations {
  std::string job_id;
  int stage_index = 0;
  int replica = 0;  // which copy of the pipeline (replicas), for metrics
  int num_stages = 1;
  v1::DType dtype = v1::DTYPE_FLOAT32;
  // Also accepted where set: under autocast (bf16-mixed) a chunk's output is
  // bf16 or fp32 depending on its last op, as in PyTorch.
  v1::DType other_dtype = v1::DTYPE_UNSPECIFIED;
  // Batches per optimizer step (accumulate_steps): a neighbour already in the
  // next optimizer step may send any of its batches before this stage starts it.
  int batches_per_step = 1;
  // Training steps the coordinator sends at once (steps_in_flight): a
  // neighbour may be this many steps ahead of this stage.
  int steps_in_flight = 1;
  // Per-sample shapes by receiving model chunk: activations its input,
  // gradients its output. A chunk absent from a map receives no such frames.
  std::map<int, std::vector<int64_t>> activation_shapes;
  std::map<int, std::vector<int64_t>> gradient_shapes;
  // Where set for a chunk, these replace the two maps above (and `dtype`):
  // the frames it receives by part (TensorFrame.part), each with its own
  // dtype and shape: a tuple's tensors; for gradients only the parts that
  // carry one (floating tensors that require grad).
  std::map<int, std::map<int, ExpectedTensor>> activation_parts;
  std::map<int, std::map<int, ExpectedTensor>> gradient_parts;
  int max_micro_batches = 0;
  int64_t max_micro_batch_size = 0;
};

// What a stage on a GPU passes to Inbox::SetSpin.
constexpr std::chrono::microseconds kGpuInboxSpin{100};

class Inbox {
 public:
  using Clock = std::chrono::steady_clock;

  // The time Take's deadlines are judged by (default: the steady clock); a
  // test's FakeClock makes a stage's timeout pass without waiting for it.
  // Set before the first Take. Not owned; outlives the inbox.
  void SetClock(conveyor::Clock* clock) { clock_ = clock; }

  // Starts accepting frames of a new job; drops whatever was held.
  void Open(InboxExpectations expect);
  // Stops accepting frames and drops whatever was held.
  void Close();

  // The stage starts (phase, step): frames of earlier steps are refused from
  // now on, and those held are dropped. Clears an earlier Fail().
  void BeginStep(v1::Phase phase, int64_t step);

  // Checks a frame (job, step, kind, micro-batch, dtype, shape, size) and holds
  // it. INVALID_ARGUMENT or FAILED_PRECONDITION naming the problem otherwise;
  // a malformed tensor also fails the step in progress, so the stage does not
  // wait for a tensor that will never come.
  // A header without payload whose carrier is NCCL goes, once checked, to the
  // fetcher of its kind (FAILED_PRECONDITION without one).
  Status Deliver(Frame frame);
  // A whole protobuf frame (its data becomes the payload, without a copy).
  Status Deliver(v1::TensorFrame frame) { return Deliver(Frame::FromProto(std::move(frame))); }

  // The checks of Deliver() on a header alone, holding nothing: a receiver
  // runs them before it allocates room for the payload. `payload_bytes` -1:
  // not known yet. A malformed header of the current job fails the step, as
  // in Deliver().
  Status CheckHeader(const v1::TensorFrame& header, int64_t payload_bytes);

  // Where headers that travel without their bytes from neighbour `from` go
  // (a header's to_upstream: it came from the downstream one); nullptr
  // unregisters. Not owned; once unregistered, never called again.
  void SetFetcher(Peer from, PayloadFetcher* fetcher);

  // Waits for the frame (kind, chunk, micro_batch, part) of the current step
  // until `deadline`. DEADLINE_EXCEEDED names what was awaited and from whom.
  StatusOr<Frame> Take(v1::FrameKind kind, int chunk, int micro_batch, Clock::time_point deadline, int part = 0);
  // Whether Take() of that frame would return at once: the frame (or its
  // header) is here, or the inbox has failed. Takes nothing.
  bool Ready(v1::FrameKind kind, int chunk, int micro_batch, int part = 0) const;

  // How long Take() spins for its frame before it sleeps (default 0: at
  // once). A GPU stage spins a little: its frames come on a fast link, and a
  // wake-up can cost more than the transfer.
  void SetSpin(std::chrono::microseconds spin);

  // Wakes every Take() with `status` until the next BeginStep().
  void Fail(const Status& status);
  // What Fail() gave for the current step; OK when it was not failed.
  Status failure() const;

  std::size_t held() const;

 private:
  // `st`, and with it the step in progress when `header` (of the current
  // job) is malformed: a good tensor will not follow. REQUIRES: mu_ held.
  Status FailStepOnMalformed(const v1::TensorFrame& header, Status st);
  using Key = std::tuple<int, int64_t, int, int, int, int>;  // phase, step, kind, chunk, micro-batch, part
  Status Check(const v1::TensorFrame& frame, int64_t payload_bytes) const;

  mutable std::mutex mu_;  // guards everything below
  std::condition_variable cv_;
  bool open_ = false;
  InboxExpectations expect_;
  v1::Phase phase_ = v1::PHASE_TRAIN;
  int64_t step_ = -1;
  int64_t train_step_ = -1;  // the last training step begun (evaluations come between)
  Status failure_;
  std::map<Key, Frame> frames_;
  std::chrono::microseconds spin_{0};
  std::atomic<uint64_t> changes_{0};  // bumped (under mu_) whenever a Take() may have more to see
  PayloadFetcher* from_upstream_ = nullptr;
  PayloadFetcher* from_downstream_ = nullptr;
  conveyor::Clock* clock_ = nullptr;  // null: the steady clock
};

}  // namespace conveyor
