#include "plan/schedule.h"

#include <algorithm>

#include "plan/job_spec.h"

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

// ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism"): B is the input
// gradient only and W, the weight gradient, trails it by P - s - 1
// micro-batches, filling the cool-down; the stage server also runs a due W
// while it waits for a frame (step_runner.cpp). Two changes, each found on
// W2's timeline on 2x H100 (2026-11-27) and in a simulation of that runner:
// - the first stage's B computes nothing (nothing before it needs a
//   gradient), so it warms up with one forward more and runs each W right
//   after its B: it computes while the first gradient comes back instead of
//   waiting, and holds P + 1 micro-batches (2P - 1 before);
// - the last stage keeps the W's of its last kLastDeferred micro-batches
//   until after its last B, so that the last gradients leave for the stages
//   before it without waiting behind a W (it holds kLastDeferred, 1 before).
// The W's keep their order on every stage, so the gradients add up in the
// same order as before.
constexpr int kLastDeferred = 3;

std::vector<Action> ZeroBubbleH1(int stage, int stages, int m) {
  std::vector<Action> out;
  const bool first = stage == 0 && stages > 1, last = stage == stages - 1 && stages > 1;
  const int warmup = std::min(m, stages - stage + (first ? 1 : 0));
  const int defer = first ? 0 : std::min(m, stages - stage - 1);
  int next_f = 0, next_w = 0;
  for (; next_f < warmup; ++next_f) out.push_back({ActionType::kForward, next_f});
  for (int b = 0; b < m; ++b) {
    out.push_back({ActionType::kBackward, b});
    if (b >= defer) out.push_back({ActionType::kWeight, next_w++});
    if (next_f < m) out.push_back({ActionType::kForward, next_f++});
  }
  while (next_w < m) out.push_back({ActionType::kWeight, next_w++});
  if (last) {  // the last micro-batches' W's after every B, in their order
    auto late = [&](const Action& a) { return a.type == ActionType::kWeight && a.micro_batch >= m - kLastDeferred; };
    std::stable_partition(out.begin(), out.end(), [&](const Action& a) { return !late(a); });
  }
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

int MostHeld(v1::ScheduleKind kind, int stage, int stages, int m) {
  const int p = stages, s = stage;
  if (kind == v1::SCHEDULE_GPIPE) return m;
  if (kind != v1::SCHEDULE_ZERO_BUBBLE || p == 1) return std::min(m, p - s);
  return std::min(m, s == 0 ? p + 1 : s == p - 1 ? kLastDeferred : 2 * (p - s) - 1);
}

StatusOr<double> SimulateStep(v1::ScheduleKind kind, int stages, int micro_batches, int virtual_stages,
                              const std::vector<double>& forward, const std::vector<double>& backward) {
  const int chunks = stages * virtual_stages;
  if (static_cast<int>(forward.size()) != chunks || static_cast<int>(backward.size()) != chunks)
    return absl::InvalidArgumentError("simulation: one forward and one backward cost per chunk");
  std::vector<std::vector<Action>> lists;
  for (int s = 0; s < stages; ++s) {
    CONVEYOR_ASSIGN_OR_RETURN(std::vector<Action> list, BuildSchedule(kind, s, stages, micro_batches, virtual_stages));
    lists.push_back(std::move(list));
  }
  const bool split = kind == v1::SCHEDULE_ZERO_BUBBLE;
  constexpr double kNotYet = -1;
  // When each (model chunk, micro-batch)'s forward and (input-gradient) backward ended.
  std::vector<std::vector<double>> forwarded(chunks, std::vector<double>(micro_batches, kNotYet));
  std::vector<std::vector<double>> backwarded = forwarded;
  std::vector<std::vector<bool>> done(stages);
  for (int s = 0; s < stages; ++s) done[s].assign(lists[s].size(), false);
  std::vector<std::size_t> next(stages, 0);  // each list's first action not done
  std::vector<double> free(stages, 0);
  double end = 0;
  // Under zero-bubble the first chunk's input-gradient pass computes nothing
  // and its weight pass is the whole backward; elsewhere each is half of it.
  auto cost = [&](const Action& a, int c) {
    if (a.type == ActionType::kForward) return forward[c];
    if (!split) return backward[c];
    if (c == 0) return a.type == ActionType::kBackward ? 0.0 : backward[c];
    return backward[c] / 2;
  };
  // When what `a` waits for arrives (kNotYet: not computed yet).
  auto arrives = [&](const Action& a, int c) {
    if (a.type == ActionType::kForward) return c > 0 ? forwarded[c - 1][a.micro_batch] : 0.0;
    if (a.type == ActionType::kBackward) return c + 1 < chunks ? backwarded[c + 1][a.micro_batch] : 0.0;
    return 0.0;
  };
  auto run = [&](int s, std::size_t i, double start) {
    const Action& a = lists[s][i];
    const int c = a.chunk * stages + s;
    free[s] = start + cost(a, c);
    end = std::max(end, free[s]);
    if (a.type == ActionType::kForward) forwarded[c][a.micro_batch] = free[s];
    if (a.type == ActionType::kBackward) backwarded[c][a.micro_batch] = free[s];
    done[s][i] = true;
    while (next[s] < lists[s].size() && done[s][next[s]]) ++next[s];
  };
  // Events in time order: the free stage that became free first acts. A
  // stage whose next action's input has not arrived runs, as the stage
  // server does under zero-bubble (step_runner.cpp), the list's next weight
  // passes whose backward is done, in order; else it waits for the input.
  // Nothing another stage has not yet simulated can arrive before the
  // earliest free stage's time, so "not computed yet" means "not yet there".
  std::vector<char> waiting(stages, 0);  // for another stage's output, since the last action
  for (;;) {
    int s = -1;  // the earliest free stage not waiting (the lowest index among equals)
    bool left = false;
    for (int t = 0; t < stages; ++t) {
      if (next[t] == lists[t].size()) continue;
      left = true;
      if (!waiting[t] && (s < 0 || free[t] < free[s])) s = t;
    }
    if (!left) break;
    if (s < 0) return absl::InternalError("simulation: the schedule deadlocks");
    const std::size_t i = next[s];
    const Action& a = lists[s][i];
    const double at = arrives(a, a.chunk * stages + s);
    if (at != kNotYet && at <= free[s]) {
      run(s, i, free[s]);
    } else {
      std::size_t pull = lists[s].size();
      for (std::size_t j = i + 1; split && j < lists[s].size(); ++j) {
        const Action& w = lists[s][j];
        if (done[s][j] || w.type != ActionType::kWeight) continue;
        if (backwarded[w.chunk * stages + s][w.micro_batch] == kNotYet) break;  // its backward has not run
        pull = j;
        break;
      }
      if (pull < lists[s].size()) {
        run(s, pull, free[s]);
      } else if (at != kNotYet) {
        run(s, i, at);
      } else {
        waiting[s] = 1;
        continue;
      }
    }
    std::fill(waiting.begin(), waiting.end(), 0);
  }
  return end;
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
