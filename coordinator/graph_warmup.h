// When two steps in flight begin: not while a stage may still be recording
// its CUDA graphs.
//
// W1 over two H100s (1F1B, 4 micro-batches of 15 MB over an NCCL link, CUDA
// graphs) hung in about half the runs with two steps in flight, always at the
// steps around the recording one (the first replay sent while the recording
// step still ran), never one step at a time, never without graphs
// (bench/RESULTS.md, "Outside clocks on the pipeline, a hang found by them").
// The coordinator therefore sends steps one at a time until every stage has
// recorded its graphs and replayed them once: two steps in a row in which
// every stage's reply says `graphed`. Where some stage never replays (a shape graphs cannot hold, a
// late recording), it stops waiting after kMaxSteps steps.
#pragma once

#include <cstdint>

namespace conveyor {

class GraphWarmup {
 public:
  static constexpr int64_t kMaxSteps = 6;

  // `graphs_may_record`: cuda_graphs is on and some stage is on a CUDA
  // device; otherwise steps may overlap from the first. `first`: the run's
  // first step (a resumed or recovered run records its graphs again).
  GraphWarmup(bool graphs_may_record, int64_t first)
      : first_(first), graphed_run_(graphs_may_record ? 0 : kSettled) {}

  // Whether step `step` may still run on the stages when `step + 1` is sent.
  bool MayOverlap(int64_t step) const { return graphed_run_ >= kSettled || step >= first_ + kMaxSteps; }

  // After each step: whether every stage replied `graphed`.
  void StepDone(bool all_graphed) {
    if (graphed_run_ < kSettled) graphed_run_ = all_graphed ? graphed_run_ + 1 : 0;
  }

 private:
  static constexpr int kSettled = 2;  // the recording step, then a replay
  const int64_t first_;
  int graphed_run_;
};

}  // namespace conveyor
