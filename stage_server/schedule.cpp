#include "stage_server/schedule.h"

#include <algorithm>

namespace conveyor {

std::vector<Action> ForwardOnly(int micro_batches) {
  std::vector<Action> out;
  for (int i = 0; i < micro_batches; ++i) out.push_back({ActionType::kForward, i});
  return out;
}

std::vector<Action> BuildSchedule(v1::ScheduleKind kind, int stage, int stages, int micro_batches) {
  const int m = micro_batches;
  std::vector<Action> out = ForwardOnly(0);
  if (kind == v1::SCHEDULE_1F1B) {
    const int warmup = std::min(m, stages - stage);
    int next_f = 0, next_b = 0;
    for (; next_f < warmup; ++next_f) out.push_back({ActionType::kForward, next_f});
    while (next_b < m) {
      out.push_back({ActionType::kBackward, next_b++});
      if (next_f < m) out.push_back({ActionType::kForward, next_f++});
    }
    return out;
  }
  out = ForwardOnly(m);
  for (int i = m - 1; i >= 0; --i) out.push_back({ActionType::kBackward, i});
  return out;
}

std::string ToString(const std::vector<Action>& actions) {
  std::string s;
  for (const Action& a : actions) {
    if (!s.empty()) s += ' ';
    s += (a.type == ActionType::kForward ? 'F' : 'B') + std::to_string(a.micro_batch);
  }
  return s;
}

}  // namespace conveyor
