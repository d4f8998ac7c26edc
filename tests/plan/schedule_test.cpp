#include "plan/schedule.h"

#include "plan/job_spec.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

namespace conveyor {
namespace {

std::string List(v1::ScheduleKind kind, int s, int p, int m, int v = 1) {
  auto list = BuildSchedule(kind, s, p, m, v);
  EXPECT_TRUE(list.ok()) << list.status();
  return list.ok() ? ToString(*list) : "";
}

TEST(Schedule, GpipeTableForFourStagesEightMicroBatches) {
  for (int s = 0; s < 4; ++s) {
    EXPECT_EQ(List(v1::SCHEDULE_GPIPE, s, 4, 8), "F0 F1 F2 F3 F4 F5 F6 F7 B7 B6 B5 B4 B3 B2 B1 B0");
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
  for (int s = 0; s < 4; ++s) EXPECT_EQ(List(v1::SCHEDULE_1F1B, s, 4, 8), expected[s]) << s;
}

TEST(Schedule, InterleavedTableForFourStagesEightMicroBatchesTwoChunks) {
  // Megatron-LM's order: micro-batches in groups of P, chunk 0 then chunk 1;
  // stage s warms up with 2(P - s - 1) + (v - 1)P forwards. "F1.4" is the
  // forward of local chunk 1 (model chunk 4 + s) for micro-batch 4.
  const char* expected[] = {
      "F0.0 F0.1 F0.2 F0.3 F1.0 F1.1 F1.2 F1.3 F0.4 F0.5 F0.6 B1.0 F0.7 B1.1 F1.4 B1.2 F1.5 B1.3 "
      "F1.6 B0.0 F1.7 B0.1 B0.2 B0.3 B1.4 B1.5 B1.6 B1.7 B0.4 B0.5 B0.6 B0.7",
      "F0.0 F0.1 F0.2 F0.3 F1.0 F1.1 F1.2 F1.3 F0.4 B1.0 F0.5 B1.1 F0.6 B1.2 F0.7 B1.3 F1.4 B0.0 "
      "F1.5 B0.1 F1.6 B0.2 F1.7 B0.3 B1.4 B1.5 B1.6 B1.7 B0.4 B0.5 B0.6 B0.7",
      "F0.0 F0.1 F0.2 F0.3 F1.0 F1.1 F1.2 B1.0 F1.3 B1.1 F0.4 B1.2 F0.5 B1.3 F0.6 B0.0 F0.7 B0.1 "
      "F1.4 B0.2 F1.5 B0.3 F1.6 B1.4 F1.7 B1.5 B1.6 B1.7 B0.4 B0.5 B0.6 B0.7",
      "F0.0 F0.1 F0.2 F0.3 F1.0 B1.0 F1.1 B1.1 F1.2 B1.2 F1.3 B1.3 F0.4 B0.0 F0.5 B0.1 F0.6 B0.2 "
      "F0.7 B0.3 F1.4 B1.4 F1.5 B1.5 F1.6 B1.6 F1.7 B1.7 B0.4 B0.5 B0.6 B0.7",
  };
  for (int s = 0; s < 4; ++s) EXPECT_EQ(List(v1::SCHEDULE_INTERLEAVED, s, 4, 8, 2), expected[s]) << s;
}

TEST(Schedule, ZeroBubbleTableForFourStagesEightMicroBatches) {
  // ZB-H1: B is the input gradient only; W, the weight gradient, trails by
  // P - s - 1 micro-batches and fills the cool-down. The first stage (whose B
  // computes nothing) warms up with one forward more and runs each W after
  // its B; the last keeps its last 3 W's until after its last B.
  const char* expected[] = {
      "F0 F1 F2 F3 F4 B0 W0 F5 B1 W1 F6 B2 W2 F7 B3 W3 B4 W4 B5 W5 B6 W6 B7 W7",
      "F0 F1 F2 B0 F3 B1 F4 B2 W0 F5 B3 W1 F6 B4 W2 F7 B5 W3 B6 W4 B7 W5 W6 W7",
      "F0 F1 B0 F2 B1 W0 F3 B2 W1 F4 B3 W2 F5 B4 W3 F6 B5 W4 F7 B6 W5 B7 W6 W7",
      "F0 B0 W0 F1 B1 W1 F2 B2 W2 F3 B3 W3 F4 B4 W4 F5 B5 F6 B6 F7 B7 W5 W6 W7",
  };
  for (int s = 0; s < 4; ++s) EXPECT_EQ(List(v1::SCHEDULE_ZERO_BUBBLE, s, 4, 8), expected[s]) << s;
  EXPECT_EQ(List(v1::SCHEDULE_ZERO_BUBBLE, 0, 1, 3), "F0 B0 W0 F1 B1 W1 F2 B2 W2");  // one stage: as it was
}

TEST(Schedule, FewerMicroBatchesThanStages) {
  EXPECT_EQ(List(v1::SCHEDULE_1F1B, 0, 4, 2), "F0 F1 B0 B1");
  EXPECT_EQ(ToString(ForwardOnly(3)), "F0 F1 F2");
  EXPECT_EQ(ToString(ForwardOnly(2, 2)), "F0.0 F0.1 F1.0 F1.1");
}

TEST(Schedule, BadArgumentsAreRefused) {
  EXPECT_TRUE(absl::IsInvalidArgument(BuildSchedule(v1::SCHEDULE_INTERLEAVED, 0, 4, 6, 2).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(BuildSchedule(v1::SCHEDULE_INTERLEAVED, 0, 4, 8, 1).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(BuildSchedule(v1::SCHEDULE_1F1B, 0, 4, 8, 2).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(BuildSchedule(v1::SCHEDULE_GPIPE, 4, 4, 8).status()));
}

// Runs every stage's list against the others: an action may run once what it
// receives was sent. Returns false on a deadlock; records the most
// micro-batch chunks each stage held at once (from forward to the end of its
// backward, or of its weight pass with zero-bubble).
bool Simulate(v1::ScheduleKind kind, int p, int m, int v, std::vector<int>* peak) {
  std::vector<std::vector<Action>> lists;
  for (int s = 0; s < p; ++s) {
    auto list = BuildSchedule(kind, s, p, m, v);
    if (!list.ok()) return false;
    lists.push_back(*list);
  }
  const int chunks = p * v;
  std::vector<std::size_t> pc(p, 0);
  // Per model chunk: micro-batches whose forward / backward is done.
  std::vector<std::set<int>> forwarded(chunks), backwarded(chunks);
  std::vector<std::set<std::pair<int, int>>> held(p);
  peak->assign(p, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < p; ++s) {
      if (pc[s] == lists[s].size()) continue;
      const Action& a = lists[s][pc[s]];
      const int c = ModelChunk(kind, s, a.chunk, p);
      const auto key = std::make_pair(a.chunk, a.micro_batch);
      if (a.type == ActionType::kForward) {
        if (c > 0 && !forwarded[c - 1].count(a.micro_batch)) continue;
        forwarded[c].insert(a.micro_batch);
        held[s].insert(key);
        (*peak)[s] = std::max((*peak)[s], static_cast<int>(held[s].size()));
      } else if (a.type == ActionType::kBackward) {
        if (c + 1 < chunks && !backwarded[c + 1].count(a.micro_batch)) continue;
        if (!held[s].count(key)) return false;  // backward before forward
        backwarded[c].insert(a.micro_batch);
        if (!SplitsBackward(kind)) held[s].erase(key);
      } else {
        if (!backwarded[c].count(a.micro_batch)) return false;  // weight pass before backward
        held[s].erase(key);
      }
      ++pc[s];
      progress = true;
    }
  }
  for (int s = 0; s < p; ++s)
    if (pc[s] != lists[s].size() || !held[s].empty()) return false;
  return true;
}

TEST(Schedule, EveryScheduleIsDeadlockFreeAndBoundsMemory) {
  for (auto kind : {v1::SCHEDULE_GPIPE, v1::SCHEDULE_1F1B, v1::SCHEDULE_ZERO_BUBBLE}) {
    for (int p = 1; p <= 8; ++p) {
      for (int m = 1; m <= 16; ++m) {
        std::vector<int> peak;
        ASSERT_TRUE(Simulate(kind, p, m, 1, &peak)) << ScheduleName(kind) << " P=" << p << " M=" << m;
        for (int s = 0; s < p; ++s) {
          // ZB-H1 keeps a micro-batch until its deferred weight pass; the
          // first stage one forward ahead, the last 3 W's deferred.
          int bound = kind == v1::SCHEDULE_GPIPE ? m : std::min(m, p - s);
          if (kind == v1::SCHEDULE_ZERO_BUBBLE) {
            bound = std::min(m, p == 1 ? 1 : s == 0 ? p + 1 : s == p - 1 ? 3 : 2 * (p - s) - 1);
          }
          EXPECT_EQ(MostHeld(kind, s, p, m), bound) << ScheduleName(kind) << " P=" << p << " M=" << m << " stage " << s;
          EXPECT_EQ(peak[s], bound) << ScheduleName(kind) << " P=" << p << " M=" << m << " stage " << s;
        }
      }
    }
  }
}

// ZB-V: chunk c on stage c for c < P, else 2P-1-c; every list holds each
// of its chunks' passes once, in micro-batch order.
TEST(Schedule, ZbvPlacesChunksInAVAndIsDeadlockFree) {
  EXPECT_EQ(StageOfChunk(v1::SCHEDULE_ZBV, 0, 4), 0);
  EXPECT_EQ(StageOfChunk(v1::SCHEDULE_ZBV, 3, 4), 3);
  EXPECT_EQ(StageOfChunk(v1::SCHEDULE_ZBV, 4, 4), 3);
  EXPECT_EQ(StageOfChunk(v1::SCHEDULE_ZBV, 7, 4), 0);
  EXPECT_EQ(ModelChunk(v1::SCHEDULE_ZBV, 1, 1, 4), 6);
  EXPECT_EQ(ModelChunk(v1::SCHEDULE_INTERLEAVED, 1, 1, 4), 5);
  EXPECT_FALSE(LinksInARing(v1::SCHEDULE_ZBV, 8, 4));
  EXPECT_TRUE(LinksInARing(v1::SCHEDULE_INTERLEAVED, 8, 4));
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 24; ++m) {
      std::vector<int> peak;
      ASSERT_TRUE(Simulate(v1::SCHEDULE_ZBV, p, m, 2, &peak)) << "P=" << p << " M=" << m;
      for (int s = 0; s < p; ++s) {
        auto list = BuildSchedule(v1::SCHEDULE_ZBV, s, p, m, 2);
        ASSERT_TRUE(list.ok());
        EXPECT_EQ(list->size(), static_cast<std::size_t>(6 * m));
        std::vector<std::vector<int>> next(2, std::vector<int>(3, 0));  // [local chunk][pass]: next micro-batch
        for (const Action& a : *list) EXPECT_EQ(a.micro_batch, next[a.chunk][static_cast<int>(a.type)]++);
      }
    }
  }
  EXPECT_TRUE(absl::IsInvalidArgument(BuildSchedule(v1::SCHEDULE_ZBV, 0, 4, 8, 1).status()));
}

TEST(Schedule, InterleavedIsDeadlockFree) {
  for (int p = 1; p <= 6; ++p) {
    for (int v = 2; v <= 4; ++v) {
      for (int m = p; m <= 4 * p; m += p) {
        std::vector<int> peak;
        EXPECT_TRUE(Simulate(v1::SCHEDULE_INTERLEAVED, p, m, v, &peak)) << "P=" << p << " M=" << m << " v=" << v;
      }
    }
  }
}

}  // namespace
}  // namespace conveyor

namespace conveyor {
namespace {

// With equal chunks (forward 1, backward 2) and free transfers a step lasts
// the textbook (M + P - 1)(f + b) for GPipe and 1F1B, (vM + P - 1)(f + b)/v
// interleaved; zero-bubble (input-gradient and weight passes half a backward
// each) is no slower than 1F1B.
TEST(Schedule, SimulatedStepsHaveTheTextbookBubbles) {
  for (int p : {1, 2, 4}) {
    for (int m : {4, 8}) {
      std::vector<double> f(p, 1.0), b(p, 2.0);
      for (v1::ScheduleKind kind : {v1::SCHEDULE_GPIPE, v1::SCHEDULE_1F1B}) {
        auto t = SimulateStep(kind, p, m, 1, f, b);
        ASSERT_TRUE(t.ok()) << t.status();
        EXPECT_DOUBLE_EQ(*t, (m + p - 1) * 3.0) << ScheduleName(kind) << " P=" << p << " M=" << m;
      }
      auto zb = SimulateStep(v1::SCHEDULE_ZERO_BUBBLE, p, m, 1, f, b);
      ASSERT_TRUE(zb.ok()) << zb.status();
      EXPECT_GE(*zb, m * 3.0);
      EXPECT_LE(*zb, (m + p - 1) * 3.0) << "P=" << p << " M=" << m;
      if (p > 1) {
        std::vector<double> f2(2 * p, 0.5), b2(2 * p, 1.0);
        auto t = SimulateStep(v1::SCHEDULE_INTERLEAVED, p, m, 2, f2, b2);
        ASSERT_TRUE(t.ok()) << t.status();
        EXPECT_DOUBLE_EQ(*t, (2 * m + p - 1) * 1.5) << "interleaved P=" << p << " M=" << m;
      }
    }
  }
  // A stage twice as slow sets the pace: 1F1B, P=2, M=4, stage 1 at 2 + 4.
  auto t = SimulateStep(v1::SCHEDULE_1F1B, 2, 4, 1, {1, 2}, {2, 4});
  ASSERT_TRUE(t.ok());
  EXPECT_DOUBLE_EQ(*t, 1 + 4 * 6.0 + 2);
  EXPECT_TRUE(absl::IsInvalidArgument(SimulateStep(v1::SCHEDULE_1F1B, 2, 4, 1, {1}, {2}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(SimulateStep(v1::SCHEDULE_INTERLEAVED, 2, 3, 2, {1, 1, 1, 1}, {2, 2, 2, 2}).status()));
}

// A link between the stages: each transfer takes its seconds and latency
// after the pass that made it, and a link slower than the compute sets the
// pace, one transfer at a time each way.
TEST(Schedule, SimulatedTransfersTakeTheirTimeOneAfterAnother) {
  // One micro-batch: F 0-1, across 1-1.6, F 1.6-2.6, B 2.6-4.6, across 4.6-5.2, B 5.2-7.2.
  auto one = SimulateStep(v1::SCHEDULE_1F1B, 2, 1, 1, {1, 1}, {2, 2}, Transfers{{0.5}, 0.1});
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_DOUBLE_EQ(*one, 7.2);
  // GPipe, 4 micro-batches, a link twice as slow as a forward: stage 1's
  // forwards begin at 3, 5, 7 and 9, its backwards end at 12 to 18, and
  // their gradients cross at 14, 16, 18 and 20: stage 0 ends at 22.
  auto slow = SimulateStep(v1::SCHEDULE_GPIPE, 2, 4, 1, {1, 1}, {2, 2}, Transfers{{2}, 0});
  ASSERT_TRUE(slow.ok()) << slow.status();
  EXPECT_DOUBLE_EQ(*slow, 22);
  auto free = SimulateStep(v1::SCHEDULE_GPIPE, 2, 4, 1, {1, 1}, {2, 2});
  ASSERT_TRUE(free.ok());
  EXPECT_LT(*free, *slow);
  EXPECT_TRUE(absl::IsInvalidArgument(
      SimulateStep(v1::SCHEDULE_GPIPE, 2, 4, 1, {1, 1}, {2, 2}, Transfers{{1, 1}, 0}).status()));
}

// W2 over two H100s (its timeline of 2026-11-27, ms): forwards 10 on both stages,
// backwards 24.5 and 24.1. Under zero-bubble stage 0's input-gradient pass
// is empty and its weight pass the whole backward; stage 1's passes are
// halves. Stage 0 computes 8 x 34.5 = 276: zero-bubble, its weight passes
// run while waiting, comes within 7 of it (282.8; measured 299.5 with the
// lists before, which it puts at about 295), 1F1B's bubble costs 33.7.
// Equal chunks (forward 1, backward 2, a whole stage's worth split over its
// two chunks): ZB-V's step comes within P - 1 chunk forwards of a stage's
// work (24 + 1.5 for P=4, M=8), where 1F1B pays (P - 1)(f + b) and ZB-H1
// (28) about a third of that.
TEST(Schedule, SimulatedZbvHasAlmostNoBubble) {
  for (int p : {2, 4, 8}) {
    for (int m : {4, 8, 16}) {
      if (m < p) continue;
      std::vector<double> f(2 * p, 0.5), b(2 * p, 1.0);
      auto t = SimulateStep(v1::SCHEDULE_ZBV, p, m, 2, f, b);
      ASSERT_TRUE(t.ok()) << t.status();
      auto zb = SimulateStep(v1::SCHEDULE_ZERO_BUBBLE, p, m, 1, std::vector<double>(p, 1.0), std::vector<double>(p, 2.0));
      ASSERT_TRUE(zb.ok());
      EXPECT_GE(*t, m * 3.0);
      EXPECT_LE(*t, m * 3.0 + (p - 1) * 0.5) << "P=" << p << " M=" << m;  // one chunk's forward a stage
      EXPECT_LT(*t, *zb) << "P=" << p << " M=" << m;
    }
  }
}

TEST(Schedule, SimulatedZeroBubbleFillsItsWaitsWithWeightPasses) {
  const std::vector<double> f{10, 10}, b{24.5, 24.1};
  auto one_f_one_b = SimulateStep(v1::SCHEDULE_1F1B, 2, 8, 1, f, b);
  auto zb = SimulateStep(v1::SCHEDULE_ZERO_BUBBLE, 2, 8, 1, f, b);
  ASSERT_TRUE(one_f_one_b.ok() && zb.ok());
  EXPECT_NEAR(*one_f_one_b, 309.7, 1e-9) << "zero-bubble " << *zb;  // measured: 311.2
  EXPECT_GE(*zb, 8 * 34.5);
  EXPECT_LE(*zb, 8 * 34.5 + 7);
  EXPECT_LT(*zb, *one_f_one_b - 20);
}

}  // namespace
}  // namespace conveyor

