// Pipeline schedules as per-stage action lists.
//
// A stage runs its list in order; each action implies its transfers: a forward
// at stage s > 0 first receives the activation from s-1, and at s < P-1 sends
// its output to s+1; a backward at s < P-1 first receives the gradient from
// s+1, and at s > 0 sends the input gradient to s-1. Sends never block (they
// are queued), so any lists where every receive's matching send comes earlier
// in the sender's list are deadlock-free; both schedules here are.
#pragma once

#include <string>
#include <vector>

#include "conveyor.pb.h"

namespace conveyor {

enum class ActionType { kForward, kBackward };

struct Action {
  ActionType type;
  int micro_batch;
  bool operator==(const Action& o) const { return type == o.type && micro_batch == o.micro_batch; }
};

// gpipe: all M forwards, then all M backwards (in reverse order).
// 1f1b:  min(M, P - s) warm-up forwards, then one forward and one backward in
//        turn, then the remaining backwards: at most min(M, P - s)
//        micro-batches in flight at stage s.
// For the eval phase use ForwardOnly().
std::vector<Action> BuildSchedule(v1::ScheduleKind kind, int stage, int stages, int micro_batches);
std::vector<Action> ForwardOnly(int micro_batches);

// "F0 F1 B0 ..." for logs and tests.
std::string ToString(const std::vector<Action>& actions);

}  // namespace conveyor
