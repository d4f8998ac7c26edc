#include "stage_server/schedule.h"

#include <algorithm>

#include "common/job_spec.h"

namespace conveyor {
namespace {

std::vector<Action> OneFOneB(int stage, int stages, int m) {
  std::vector<Action> out;
  const int warmup = std::min(m, stages - stage);
  int next_f = 0;
  for (; next_f < warmup; ++next_f) out.push_back({ActionType::kForward, next_f});
  for (int b = 0; b < m; ++b) {
    out.push_back({ActionType::kBackward, b});
    if (next_f < m) out.push_back({ActionType::kForward, next_f++});
  }
  return out;
}

std::vector<Action> ZeroBubbleH1(int stage, int stages, int m) {
  std::vector<Action> out;
  const int warmup = std::min(m, stages - stage);
  const int defer = std::min(m, stages - stage - 1);
  int next_f = 0, next_w = 0;
  for (; next_f < warmup; ++next_f) out.push_back({ActionType::kForward, next_f});
  for (int b = 0; b < m; ++b) {
    out.push_back({ActionType::kBackward, b});
    if (b >= defer) out.push_back({ActionType::kWeight, next_w++});
    if (next_f < m) out.push_back({ActionType::kForward, next_f++});
  }
  while (next_w < m) out.push_back({ActionType::kWeight, next_w++});
  return out;
}

// Megatron-LM's interleaved schedule (forward_backward_pipelining_with_interleaving).
std::vector<Action> Interleaved(int stage, int stages, int m, int v) {
  const int total = m * v;
  auto micro_batch = [&](int k) { return (k / (stages * v)) * stages + k % stages; };
  auto forward_chunk = [&](int k) { return (k / stages) % v; };
  auto backward_chunk = [&](int k) { return v - 1 - (k / stages) % v; };
  int warmup = m == stages ? total : std::min(total, (stages - stage - 1) * 2 + (v - 1) * stages);
  std::vector<Action> out;
  for (int k = 0; k < warmup; ++k) out.push_back({ActionType::kForward, micro_batch(k), forward_chunk(k)});
  for (int i = 0; i < total - warmup; ++i) {
    int k = warmup + i;
    out.push_back({ActionType::kForward, micro_batch(k), forward_chunk(k)});
    out.push_back({ActionType::kBackward, micro_batch(i), backward_chunk(i)});
  }
  for (int i = std::max(0, total - warmup); i < total; ++i)
    out.push_back({ActionType::kBackward, micro_batch(i), backward_chunk(i)});
  return out;
}

}  // namespace

std::vector<Action> ForwardOnly(int micro_batches, int virtual_stages) {
  std::vector<Action> out;
  for (int c = 0; c < virtual_stages; ++c)
    for (int i = 0; i < micro_batches; ++i) out.push_back({ActionType::kForward, i, c});
  return out;
}

StatusOr<std::vector<Action>> BuildSchedule(v1::ScheduleKind kind, int stage, int stages, int micro_batches,
                                            int virtual_stages) {
  const int m = micro_batches, v = virtual_stages;
  if (stages < 1 || stage < 0 || stage >= stages || m < 1 || v < 1)
    return absl::InvalidArgumentError("schedule: bad stage, stage count or micro-batch count");
  if (kind == v1::SCHEDULE_INTERLEAVED) {
    if (v < 2) return absl::InvalidArgumentError("schedule interleaved: needs virtual_stages of 2 or more");
    if (m % stages != 0) {
      return absl::InvalidArgumentError("schedule interleaved: micro-batches (" + std::to_string(m) +
                                        ") must be a multiple of the stages (" + std::to_string(stages) + ")");
    }
    return Interleaved(stage, stages, m, v);
  }
  if (v != 1) {
    return absl::InvalidArgumentError("schedule " + ScheduleName(kind) +
                                      ": virtual_stages is for the interleaved schedule only");
  }
  switch (kind) {
    case v1::SCHEDULE_1F1B: return OneFOneB(stage, stages, m);
    case v1::SCHEDULE_ZERO_BUBBLE: return ZeroBubbleH1(stage, stages, m);
    case v1::SCHEDULE_GPIPE: {
      std::vector<Action> out = ForwardOnly(m);
      for (int i = m - 1; i >= 0; --i) out.push_back({ActionType::kBackward, i});
      return out;
    }
    default: return absl::InvalidArgumentError("schedule: unknown kind");
  }
}

std::string ToString(const std::vector<Action>& actions) {
  const bool chunks = std::any_of(actions.begin(), actions.end(), [](const Action& a) { return a.chunk != 0; });
  std::string s;
  for (const Action& a : actions) {
    if (!s.empty()) s += ' ';
    s += a.type == ActionType::kForward ? 'F' : a.type == ActionType::kBackward ? 'B' : 'W';
    if (chunks) s += std::to_string(a.chunk) + ".";
    s += std::to_string(a.micro_batch);
  }
  return s;
}

}  // namespace conveyor
