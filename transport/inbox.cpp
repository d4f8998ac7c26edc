#include "transport/inbox.h"

#include <algorithm>
#include <optional>

#include "common/metrics.h"
#include "common/spin.h"

#include "common/wire.h"

namespace conveyor {
namespace {

std::string KindName(v1::FrameKind kind) {
  return kind == v1::FRAME_ACTIVATION ? "activation" : kind == v1::FRAME_GRADIENT ? "gradient" : "frame";
}

}  // namespace

void Inbox::Open(InboxExpectations expect) {
  std::lock_guard<std::mutex> lock(mu_);
  expect_ = std::move(expect);
  open_ = true;
  phase_ = v1::PHASE_TRAIN;
  step_ = -1;
  train_step_ = -1;
  failure_ = absl::OkStatus();
  frames_.clear();
}

void Inbox::Close() {
  std::lock_guard<std::mutex> lock(mu_);
  open_ = false;
  frames_.clear();
  failure_ = absl::FailedPreconditionError("the stage was released");
  changes_.fetch_add(1, std::memory_order_release);
  cv_.notify_all();
}

void Inbox::BeginStep(v1::Phase phase, int64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  phase_ = phase;
  step_ = step;
  if (phase == v1::PHASE_TRAIN) train_step_ = step;
  failure_ = absl::OkStatus();
  for (auto it = frames_.begin(); it != frames_.end();) {
    bool current = std::get<0>(it->first) == phase && std::get<1>(it->first) >= step;
    it = current ? std::next(it) : frames_.erase(it);
  }
}

Status Inbox::CheckHeader(const v1::TensorFrame& header, int64_t payload_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  return FailStepOnMalformed(header, Check(header, payload_bytes));
}

Status Inbox::FailStepOnMalformed(const v1::TensorFrame& header, Status st) {
  // A malformed tensor of the current job will never be followed by a good
  // one: fail the step now rather than time out.
  if (!st.ok() && open_ && header.job_id() == expect_.job_id && absl::IsInvalidArgument(st)) {
    failure_ = st;
    changes_.fetch_add(1, std::memory_order_release);
    cv_.notify_all();
  }
  return st;
}

void Inbox::SetFetcher(Peer from, PayloadFetcher* fetcher) {
  std::lock_guard<std::mutex> lock(mu_);
  (from == Peer::kUpstream ? from_upstream_ : from_downstream_) = fetcher;
}

Status Inbox::Check(const v1::TensorFrame& f, int64_t payload_bytes) const {
  const std::string who = "stage " + std::to_string(expect_.stage_index);
  if (!open_) return absl::FailedPreconditionError(who + " has no job configured");
  if (f.job_id() != expect_.job_id)
    return absl::FailedPreconditionError(who + " runs job '" + expect_.job_id + "', not '" + f.job_id() + "'");
  if (f.phase() != v1::PHASE_TRAIN && f.phase() != v1::PHASE_EVAL)
    return absl::InvalidArgumentError(who + ": frame has no phase");
  // A neighbour may start the next step (or the evaluation's first batch, or
  // the training step after an evaluation) before this stage does; with
  // steps_in_flight 2, the step after that too (the coordinator sends step
  // N+2 once every stage replied to N, and this stage may not have begun N+1).
  const int64_t ahead =
      static_cast<int64_t>(std::max(1, expect_.batches_per_step)) * std::max(1, expect_.steps_in_flight);
  bool step_ok = f.phase() == phase_ ? (f.step() >= step_ && f.step() <= step_ + ahead)
                 : f.phase() == v1::PHASE_EVAL ? f.step() == 0
                                                : (f.step() > train_step_ && f.step() <= train_step_ + ahead);
  if (!step_ok) {
    return absl::FailedPreconditionError(who + " does not expect tensors of step " + std::to_string(f.step()) +
                                         " (it is at step " + std::to_string(step_) + ")");
  }
  const bool act = f.kind() == v1::FRAME_ACTIVATION;
  if (!act && f.kind() != v1::FRAME_GRADIENT) return absl::InvalidArgumentError(who + ": frame has no kind");
  // The tensor expected: by part where the chunk's boundary has its list,
  // else one tensor of the job's dtype.
  v1::DType dtype = expect_.dtype;
  const std::vector<int64_t>* sample = nullptr;
  const auto& parts = act ? expect_.activation_parts : expect_.gradient_parts;
  const auto& shapes = act ? expect_.activation_shapes : expect_.gradient_shapes;
  if (auto pc = parts.find(f.chunk()); pc != parts.end()) {
    auto pt = pc->second.find(f.part());
    if (pt == pc->second.end()) {
      return absl::InvalidArgumentError(who + " expects no " + KindName(f.kind()) + " tensor " +
                                        std::to_string(f.part()) + " for chunk " + std::to_string(f.chunk()));
    }
    dtype = pt->second.dtype;
    sample = &pt->second.sample_shape;
  } else if (auto it = shapes.find(f.chunk()); it != shapes.end()) {
    if (f.part() != 0) {
      return absl::InvalidArgumentError(who + " expects one " + KindName(f.kind()) + " tensor for chunk " +
                                        std::to_string(f.chunk()) + ", not part " + std::to_string(f.part()));
    }
    sample = &it->second;
  } else {
    return absl::InvalidArgumentError(who + " expects no " + KindName(f.kind()) + " tensors for chunk " +
                                      std::to_string(f.chunk()));
  }
  if (f.micro_batch() < 0 || f.micro_batch() >= expect_.max_micro_batches) {
    return absl::InvalidArgumentError(who + ": micro-batch " + std::to_string(f.micro_batch()) +
                                      " is out of range [0, " + std::to_string(expect_.max_micro_batches) + ")");
  }
  const std::string what = who + " step " + std::to_string(f.step()) + " micro-batch " +
                           std::to_string(f.micro_batch()) + ": " + KindName(f.kind()) +
                           (f.part() != 0 ? " tensor " + std::to_string(f.part()) : "");
  int64_t rows = f.tensor().shape_size() > 0 ? f.tensor().shape(0) : 0;
  if (rows < 1 || rows > expect_.max_micro_batch_size) rows = expect_.max_micro_batch_size;
  std::vector<int64_t> shape{rows};
  shape.insert(shape.end(), sample->begin(), sample->end());
  if (!f.tensor().data().empty()) return absl::InvalidArgumentError(what + ": data in the header");
  const bool other = expect_.other_dtype != v1::DTYPE_UNSPECIFIED && f.tensor().dtype() == expect_.other_dtype;
  return CheckWireTensor(f.tensor(), payload_bytes, other ? expect_.other_dtype : dtype, shape, what);
}

Status Inbox::Deliver(Frame frame) {
  std::lock_guard<std::mutex> lock(mu_);
  const bool fetch = !frame.payload && frame.header.carrier() == v1::CARRIER_NCCL;
  Status st = frame.payload || fetch ? Check(frame.header, frame.payload ? frame.payload->bytes() : -1)
                                     : absl::InvalidArgumentError("stage " + std::to_string(expect_.stage_index) +
                                                                  ": a frame without its tensor's bytes");
  if (!st.ok()) return FailStepOnMalformed(frame.header, st);
  const v1::TensorFrame& h = frame.header;
  Key key{h.phase(), h.step(), h.kind(), h.chunk(), h.micro_batch(), h.part()};
  if (frames_.count(key)) {
    return absl::AlreadyExistsError("stage " + std::to_string(expect_.stage_index) + ": a " +
                                    KindName(h.kind()) + " for step " + std::to_string(h.step()) +
                                    " micro-batch " + std::to_string(h.micro_batch()) +
                                    (h.part() != 0 ? " tensor " + std::to_string(h.part()) : "") + " arrived twice");
  }
  if (fetch) {
    PayloadFetcher* fetcher = h.to_upstream() ? from_downstream_ : from_upstream_;
    if (!fetcher) {
      return absl::FailedPreconditionError("stage " + std::to_string(expect_.stage_index) + " has no NCCL link from its " +
                                           (h.to_upstream() ? "downstream" : "upstream") + " neighbour for " +
                                           KindName(h.kind()) + " tensors");
    }
    return fetcher->Fetch(std::move(frame.header));
  }
  metrics::Add(metrics::Id::kStageReceivedBytes,
               {{"job_id", expect_.job_id},
                {"stage", std::to_string(expect_.stage_index)},
                {"replica", std::to_string(expect_.replica)},
                {"peer", h.to_upstream() ? "downstream" : "upstream"},
                {"transport", h.carrier() == v1::CARRIER_NCCL ? "nccl" : "grpc"}},
               static_cast<double>(frame.payload->bytes()));
  frames_.emplace(key, std::move(frame));
  changes_.fetch_add(1, std::memory_order_release);
  cv_.notify_all();
  return absl::OkStatus();
}

void Inbox::SetSpin(std::chrono::microseconds spin) {
  std::lock_guard<std::mutex> lock(mu_);
  spin_ = spin;
}

StatusOr<Frame> Inbox::Take(v1::FrameKind kind, int chunk, int micro_batch, Clock::time_point deadline, int part) {
  std::unique_lock<std::mutex> lock(mu_);
  Key key{phase_, step_, kind, chunk, micro_batch, part};
  std::optional<Clock::time_point> spin_until;
  for (;;) {
    if (!failure_.ok()) return failure_;
    auto it = frames_.find(key);
    if (it != frames_.end()) {
      Frame f = std::move(it->second);
      frames_.erase(it);
      return f;
    }
    if (!spin_until) spin_until = clock_ ? deadline : std::min(deadline, Clock::now() + spin_);
    if (!clock_ && Clock::now() < *spin_until) {  // spin outside the lock until something changes
      const uint64_t seen = changes_.load(std::memory_order_relaxed);
      lock.unlock();
      for (int i = 1; changes_.load(std::memory_order_acquire) == seen; ++i) {
        if ((i & 63) == 0 && Clock::now() >= *spin_until) break;
        CpuRelax();
      }
      lock.lock();
      continue;
    }
    const bool timed_out =
        clock_ ? !clock_->WaitUntil(cv_, lock, deadline, [&] { return frames_.count(key) > 0 || !failure_.ok(); })
               : cv_.wait_until(lock, deadline) == std::cv_status::timeout;
    if (timed_out && !frames_.count(key) && failure_.ok()) {
      const bool act = kind == v1::FRAME_ACTIVATION;
      const int p = std::max(1, expect_.num_stages);
      const int peer = (expect_.stage_index + (act ? p - 1 : 1)) % p;
      return absl::DeadlineExceededError(
          "stage " + std::to_string(expect_.stage_index) + " waited too long for the " + KindName(kind) +
          " of step " + std::to_string(step_) + " micro-batch " + std::to_string(micro_batch) +
          (part != 0 ? " tensor " + std::to_string(part) : "") +
          (expect_.activation_shapes.size() + expect_.gradient_shapes.size() > 2 ? " chunk " + std::to_string(chunk) : "") +
          " from stage " + std::to_string(peer) + " (" + (act ? "upstream" : "downstream") + ")");
    }
  }
}

bool Inbox::Ready(v1::FrameKind kind, int chunk, int micro_batch, int part) const {
  std::lock_guard<std::mutex> lock(mu_);
  return !failure_.ok() || frames_.count(Key{phase_, step_, kind, chunk, micro_batch, part}) > 0;
}

void Inbox::Fail(const Status& status) {
  std::lock_guard<std::mutex> lock(mu_);
  failure_ = status;
  changes_.fetch_add(1, std::memory_order_release);
  cv_.notify_all();
}

Status Inbox::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

std::size_t Inbox::held() const {
  std::lock_guard<std::mutex> lock(mu_);
  return frames_.size();
}

}  // namespace conveyor
