#include "plan/schedule.h"

#include <algorithm>
#include <array>
#include <map>
#include <mutex>

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


// ZB-V's lists for every stage (see schedule.h), from a simulation in which
// forward, input-gradient and weight passes take one unit each (the first
// chunk's input gradient none and its weight pass two, as in SimulateStep).
// Each chunk runs its forwards, backwards and weight passes in micro-batch
// order, so gradients add up in the same order on every run. A list built
// from one run of the simulation is deadlock-free: every receive's send
// comes earlier in its sender's list.
class ZbvBuilder {
 public:
  ZbvBuilder(int stages, int m)
      : p_(stages), m_(m), chunks_(2 * stages),
        f_end_(chunks_, std::vector<double>(m, kNotYet)), b_end_(f_end_),
        next_(chunks_, {0, 0, 0}), free_(p_, 0), lists_(p_) {}

  StatusOr<std::vector<std::vector<Action>>> Build() {
    for (int left = 3 * chunks_ * m_; left > 0; --left) {
      int best = -1;
      Pick pick;
      for (int s = 0; s < p_; ++s) {
        Pick here = Choose(s);
        if (here.local >= 0 && (best < 0 || here.at < pick.at)) best = s, pick = here;
      }
      if (best < 0) return absl::InternalError("schedule zbv: the simulation deadlocks");
      Run(best, pick);
    }
    return lists_;
  }

 private:
  static constexpr double kNotYet = -1;
  struct Pick {
    ActionType type = ActionType::kForward;
    int local = -1;  // -1: nothing this stage can run
    double at = 0;
  };

  int Chunk(int s, int local) const { return ModelChunk(v1::SCHEDULE_ZBV, s, local, p_); }
  // When the pass `type` of chunk c's next micro-batch could start (kNotYet:
  // what it waits for is not scheduled, or there is none left).
  double Ready(ActionType type, int c) const {
    const int mb = next_[c][static_cast<int>(type)];
    if (mb >= m_) return kNotYet;
    switch (type) {
      case ActionType::kForward: return c == 0 ? 0.0 : f_end_[c - 1][mb];
      case ActionType::kBackward:
        if (f_end_[c][mb] == kNotYet) return kNotYet;
        return c + 1 == chunks_ ? f_end_[c][mb] : b_end_[c + 1][mb];
      case ActionType::kWeight: return b_end_[c][mb];
    }
    return kNotYet;
  }
  // The stage's next pass: the earliest ready, input gradients before
  // forwards (the later chunk's first) before weight passes. Forwards are
  // not held back to bound memory: on W2's costs over 4 stages (8
  // micro-batches) a bound of 1F1B's 2P micro-batch chunks made the
  // simulated step 7% longer (145.8 against 136.3), and of the bounds tried
  // from 2P to 2M only those of 14 and more matched no bound.
  Pick Choose(int s) const {
    Pick out;
    for (ActionType type : {ActionType::kBackward, ActionType::kForward, ActionType::kWeight}) {
      for (int local : {1, 0}) {
        const double ready = Ready(type, Chunk(s, local));
        if (ready == kNotYet) continue;
        const double at = std::max(ready, free_[s]);
        // What can start at the stage's free time, in the order above;
        // else what becomes ready first.
        const bool now = at <= free_[s];
        if (out.local < 0 || (now && out.at > free_[s]) || (!now && at < out.at)) {
          out = {type, local, at};
        }
      }
    }
    return out;
  }

  double Cost(ActionType type, int c) const {
    if (type == ActionType::kForward) return 1;
    if (c != 0) return 1;
    return type == ActionType::kBackward ? 0 : 2;
  }

  void Run(int s, const Pick& pick) {
    const int c = Chunk(s, pick.local);
    int& next = next_[c][static_cast<int>(pick.type)];
    const int mb = next++;
    free_[s] = pick.at + Cost(pick.type, c);
    if (pick.type == ActionType::kForward) f_end_[c][mb] = free_[s];
    if (pick.type == ActionType::kBackward) b_end_[c][mb] = free_[s];
    lists_[s].push_back({pick.type, mb, pick.local});
  }

  const int p_, m_, chunks_;
  std::vector<std::vector<double>> f_end_, b_end_;  // [model chunk][micro-batch]: when it ended
  std::vector<std::array<int, 3>> next_;           // [model chunk][pass type]: its next micro-batch
  std::vector<double> free_;
  std::vector<std::vector<Action>> lists_;
};

// The lists depend only on (P, M); the partitioner simulates thousands of
// cuts with the same ones.
StatusOr<std::vector<std::vector<Action>>> ZeroBubbleV(int stages, int m) {
  static std::mutex mu;
  static std::map<std::pair<int, int>, std::vector<std::vector<Action>>> made;
  std::lock_guard<std::mutex> lock(mu);
  auto it = made.find({stages, m});
  if (it != made.end()) return it->second;
  CONVEYOR_ASSIGN_OR_RETURN(auto lists, ZbvBuilder(stages, m).Build());
  if (made.size() > 64) made.clear();
  return made.emplace(std::make_pair(stages, m), std::move(lists)).first->second;
}

}  // namespace

int StageOfChunk(v1::ScheduleKind kind, int chunk, int stages) {
  if (kind == v1::SCHEDULE_ZBV) return chunk < stages ? chunk : 2 * stages - 1 - chunk;
  return chunk % stages;
}

int ModelChunk(v1::ScheduleKind kind, int stage, int local, int stages) {
  if (kind == v1::SCHEDULE_ZBV) return local == 0 ? stage : 2 * stages - 1 - stage;
  return local * stages + stage;
}

bool SplitsBackward(v1::ScheduleKind kind) {
  return kind == v1::SCHEDULE_ZERO_BUBBLE || kind == v1::SCHEDULE_ZBV;
}

bool LinksInARing(v1::ScheduleKind kind, int chunks, int stages) {
  return kind != v1::SCHEDULE_ZBV && chunks > stages;
}

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
  if (kind == v1::SCHEDULE_ZBV) {
    if (v != 2) return absl::InvalidArgumentError("schedule zbv: places two chunks on each stage (virtual_stages 2)");
    CONVEYOR_ASSIGN_OR_RETURN(auto lists, ZeroBubbleV(stages, m));
    return lists[static_cast<std::size_t>(stage)];
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
                              const std::vector<double>& forward, const std::vector<double>& backward,
                              const Transfers& transfers) {
  const int chunks = stages * virtual_stages;
  if (static_cast<int>(forward.size()) != chunks || static_cast<int>(backward.size()) != chunks)
    return absl::InvalidArgumentError("simulation: one forward and one backward cost per chunk");
  if (!transfers.seconds.empty() && static_cast<int>(transfers.seconds.size()) != chunks - 1)
    return absl::InvalidArgumentError("simulation: one transfer time per pair of neighbouring chunks");
  std::vector<std::vector<Action>> lists;
  for (int s = 0; s < stages; ++s) {
    CONVEYOR_ASSIGN_OR_RETURN(std::vector<Action> list, BuildSchedule(kind, s, stages, micro_batches, virtual_stages));
    lists.push_back(std::move(list));
  }
  const bool split = SplitsBackward(kind);
  constexpr double kNotYet = -1;
  // When each (model chunk, micro-batch)'s forward and (input-gradient) backward ended.
  std::vector<std::vector<double>> forwarded(chunks, std::vector<double>(micro_batches, kNotYet));
  std::vector<std::vector<double>> backwarded = forwarded;
  // When chunk c's input (from c - 1) and its output's gradient (from c + 1)
  // arrive for each micro-batch, and when each link between c and c + 1 is
  // free again, forward and back (a link sends one transfer at a time each
  // way, beside the compute).
  std::vector<std::vector<double>> input_at = forwarded, gradient_at = forwarded;
  std::vector<double> forward_link(chunks, 0), backward_link(chunks, 0);
  auto send = [&](int from, int to, int link, double ready, std::vector<double>& link_free) {
    if (transfers.seconds.empty() || StageOfChunk(kind, from, stages) == StageOfChunk(kind, to, stages)) return ready;
    const double start = std::max(ready, link_free[link]);
    link_free[link] = start + transfers.seconds[link];
    return link_free[link] + transfers.latency;
  };
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
    if (a.type == ActionType::kForward) return c > 0 ? input_at[c][a.micro_batch] : 0.0;
    if (a.type == ActionType::kBackward) return c + 1 < chunks ? gradient_at[c][a.micro_batch] : 0.0;
    return 0.0;
  };
  auto run = [&](int s, std::size_t i, double start) {
    const Action& a = lists[s][i];
    const int c = ModelChunk(kind, s, a.chunk, stages);
    free[s] = start + cost(a, c);
    end = std::max(end, free[s]);
    const int m = a.micro_batch;
    if (a.type == ActionType::kForward) {
      forwarded[c][m] = free[s];
      if (c + 1 < chunks) input_at[c + 1][m] = send(c, c + 1, c, free[s], forward_link);
    }
    if (a.type == ActionType::kBackward) {
      backwarded[c][m] = free[s];
      if (c > 0) gradient_at[c - 1][m] = send(c, c - 1, c - 1, free[s], backward_link);
    }
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
    const double at = arrives(a, ModelChunk(kind, s, a.chunk, stages));
    if (at != kNotYet && at <= free[s]) {
      run(s, i, free[s]);
    } else {
      std::size_t pull = lists[s].size();
      for (std::size_t j = i + 1; split && j < lists[s].size(); ++j) {
        const Action& w = lists[s][j];
        if (done[s][j] || w.type != ActionType::kWeight) continue;
        if (backwarded[ModelChunk(kind, s, w.chunk, stages)][w.micro_batch] == kNotYet) break;  // its backward has not run
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
