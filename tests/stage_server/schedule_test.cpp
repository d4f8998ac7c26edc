#include "stage_server/schedule.h"

#include "common/job_spec.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

namespace conveyor {
namespace {

TEST(Schedule, GpipeTableForFourStagesEightMicroBatches) {
  for (int s = 0; s < 4; ++s) {
    EXPECT_EQ(ToString(BuildSchedule(v1::SCHEDULE_GPIPE, s, 4, 8)),
              "F0 F1 F2 F3 F4 F5 F6 F7 B7 B6 B5 B4 B3 B2 B1 B0");
  }
}

TEST(Schedule, OneFOneBTableForFourStagesEightMicroBatches) {
  // Written out by hand: P - s warm-up forwards, then backward/forward pairs.
  const char* expected[] = {
      "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7",
      "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7",
      "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7",
      "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7",
  };
  for (int s = 0; s < 4; ++s) EXPECT_EQ(ToString(BuildSchedule(v1::SCHEDULE_1F1B, s, 4, 8)), expected[s]) << s;
}

TEST(Schedule, FewerMicroBatchesThanStages) {
  EXPECT_EQ(ToString(BuildSchedule(v1::SCHEDULE_1F1B, 0, 4, 2)), "F0 F1 B0 B1");
  EXPECT_EQ(ToString(ForwardOnly(3)), "F0 F1 F2");
}

// Runs every stage's list against the others: an action may run once what it
// receives was sent. Returns false on a deadlock; records the most
// micro-batches each stage held at once.
bool Simulate(v1::ScheduleKind kind, int p, int m, std::vector<int>* peak) {
  std::vector<std::vector<Action>> lists;
  for (int s = 0; s < p; ++s) lists.push_back(BuildSchedule(kind, s, p, m));
  std::vector<std::size_t> pc(p, 0);
  std::vector<std::set<int>> forwarded(p), backwarded(p), held(p);
  peak->assign(p, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < p; ++s) {
      if (pc[s] == lists[s].size()) continue;
      const Action& a = lists[s][pc[s]];
      if (a.type == ActionType::kForward) {
        if (s > 0 && !forwarded[s - 1].count(a.micro_batch)) continue;
        forwarded[s].insert(a.micro_batch);
        held[s].insert(a.micro_batch);
        (*peak)[s] = std::max((*peak)[s], static_cast<int>(held[s].size()));
      } else {
        if (s + 1 < p && !backwarded[s + 1].count(a.micro_batch)) continue;
        if (!held[s].count(a.micro_batch)) return false;  // backward before forward
        backwarded[s].insert(a.micro_batch);
        held[s].erase(a.micro_batch);
      }
      ++pc[s];
      progress = true;
    }
  }
  for (int s = 0; s < p; ++s)
    if (pc[s] != lists[s].size()) return false;
  return true;
}

TEST(Schedule, EveryScheduleIsDeadlockFreeAndBoundsMemory) {
  for (auto kind : {v1::SCHEDULE_GPIPE, v1::SCHEDULE_1F1B}) {
    for (int p = 1; p <= 8; ++p) {
      for (int m = 1; m <= 16; ++m) {
        std::vector<int> peak;
        ASSERT_TRUE(Simulate(kind, p, m, &peak)) << ScheduleName(kind) << " P=" << p << " M=" << m;
        for (int s = 0; s < p; ++s) {
          int bound = kind == v1::SCHEDULE_1F1B ? std::min(m, p - s) : m;
          EXPECT_EQ(peak[s], bound) << "P=" << p << " M=" << m << " stage " << s;
        }
      }
    }
  }
}

}  // namespace
}  // namespace conveyor
