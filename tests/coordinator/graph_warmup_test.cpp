#include "coordinator/graph_warmup.h"

#include <gtest/gtest.h>

namespace conveyor {
namespace {

// Step 0 runs eagerly, step 1 records the graphs, step 2 replays them: steps
// overlap only from step 3 (step 4 is sent with it).
TEST(GraphWarmup, StepsGoOneAtATimeUntilEveryStageReplayedItsGraphs) {
  GraphWarmup w(/*graphs_may_record=*/true, /*first=*/0);
  EXPECT_FALSE(w.MayOverlap(0));
  w.StepDone(false);  // eager
  EXPECT_FALSE(w.MayOverlap(1));
  w.StepDone(true);  // recorded
  EXPECT_FALSE(w.MayOverlap(2));
  w.StepDone(true);  // replayed
  EXPECT_TRUE(w.MayOverlap(3));
  w.StepDone(false);  // a short last batch of an epoch runs eagerly: settled already
  EXPECT_TRUE(w.MayOverlap(4));
}

TEST(GraphWarmup, AStageThatStopsReplayingStartsTheCountAgain) {
  GraphWarmup w(true, 10);  // resumed at step 10
  w.StepDone(false);
  w.StepDone(true);
  w.StepDone(false);  // one stage did not replay
  EXPECT_FALSE(w.MayOverlap(13));
  w.StepDone(true);
  w.StepDone(true);
  EXPECT_TRUE(w.MayOverlap(15));
}

TEST(GraphWarmup, WithoutGraphsStepsOverlapFromTheFirst) {
  EXPECT_TRUE(GraphWarmup(false, 0).MayOverlap(0));
  EXPECT_TRUE(GraphWarmup(false, 7).MayOverlap(7));
}

TEST(GraphWarmup, AJobWhoseStagesNeverReplayStopsWaitingAfterSomeSteps) {
  GraphWarmup w(true, 4);
  for (int64_t step = 4; step < 4 + GraphWarmup::kMaxSteps; ++step) {
    EXPECT_FALSE(w.MayOverlap(step)) << step;
    w.StepDone(false);
  }
  EXPECT_TRUE(w.MayOverlap(4 + GraphWarmup::kMaxSteps));
}

}  // namespace
}  // namespace conveyor
