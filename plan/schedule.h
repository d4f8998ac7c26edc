// Pipeline schedules as per-stage action lists.
//
// A stage runs its list in order; each action implies its transfers. With P
// stages and v chunks per stage, the model is a chain of P*v chunks and chunk
// c lives on stage StageOfChunk(c): c % P (interleaved: the stage before
// chunk c is c - 1's, wrapping from the first stage to the last), or, under
// zbv, in a V: chunks 0..P-1 down the stages and P..2P-1 back up, so that
// stage s holds chunks s and 2P-1-s and the first stage the first and the
// last. A forward of chunk c > 0 first receives its input from chunk c-1,
// and a forward of any chunk but the last sends its output on. A
// backward of a chunk but the last first receives the output gradient from
// chunk c+1, and a backward of chunk c > 0 sends the input gradient back.
// Sends never block (they are queued), so lists in which every receive's
// matching send comes earlier in the sender's list are deadlock-free; a test
// simulates every schedule here for many (P, M, v) to check it.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "conveyor.pb.h"

namespace conveyor {

enum class ActionType {
  kForward,
  kBackward,  // the whole backward; with zero-bubble only the input gradient
  kWeight,    // zero-bubble: the weight gradient, deferred
};

struct Action {
  ActionType type;
  int micro_batch;
  int chunk = 0;  // local chunk index on this stage (its model chunk: ModelChunk)
  bool operator==(const Action& o) const {
    return type == o.type && micro_batch == o.micro_batch && chunk == o.chunk;
  }
};

// gpipe:       all M forwards, then all M backwards in reverse order.
// 1f1b:        min(M, P - s) warm-up forwards, then backward/forward pairs,
//              then the remaining backwards: at most min(M, P - s)
//              micro-batches in flight at stage s.
// interleaved: Megatron-LM's interleaved 1F1B over v chunks per stage;
//              needs v >= 2 and M a multiple of P.
// zero-bubble: ZB-H1: 1F1B whose backwards compute only the input gradient;
//              each weight-gradient pass is deferred by P - s - 1
//              micro-batches, into what would be the cool-down bubble; the
//              first stage warms up with one forward more, the last defers
//              its last 3 weight passes past its last backward.
// zbv:         ZB-V (Qi et al., "Pipeline Parallelism with Controllable
//              Memory"): two chunks a stage placed in a V, backward split as
//              under zero-bubble. Its lists come from a simulation of every
//              stage in which each pass takes one unit: a free stage runs an
//              input-gradient pass if one is due, else a forward, else the
//              oldest due weight pass. It trades memory for the bubble: the
//              first stage may hold every micro-batch, as under GPipe.
//              Needs virtual_stages 2.
// INVALID_ARGUMENT when the arguments do not fit the schedule.
StatusOr<std::vector<Action>> BuildSchedule(v1::ScheduleKind kind, int stage, int stages, int micro_batches,
                                            int virtual_stages = 1);

// The most micro-batches stage `stage` holds at once running its list of
// gpipe, 1f1b or zero-bubble as written (from a forward to the end of its
// backward, or of its weight pass under zero-bubble). Zero-bubble's stage
// server, running weight passes early while it waits, holds at most this and
// at least 1F1B's.
int MostHeld(v1::ScheduleKind kind, int stage, int stages, int micro_batches);

// Where the chunks live: the stage of model chunk `chunk`, and the model
// chunk of a stage's local chunk `local` (its chunks in increasing order).
int StageOfChunk(v1::ScheduleKind kind, int chunk, int stages);
int ModelChunk(v1::ScheduleKind kind, int stage, int local, int stages);
// Whether the schedule's backward is two passes, input and weight gradient
// (zero-bubble, zbv).
bool SplitsBackward(v1::ScheduleKind kind);
// Whether the last stage sends to the first (interleaved's chunks wrap).
bool LinksInARing(v1::ScheduleKind kind, int chunks, int stages);
// Eval: every micro-batch through every local chunk, in chain order.
std::vector<Action> ForwardOnly(int micro_batches, int virtual_stages = 1);

// How long one step takes when each stage runs its list in order, an action
// starts once its stage is free and its input has arrived (after its
// transfer, `transfers`), and every action of model chunk c costs forward[c] or backward[c].
// Where backward is split the input-gradient and weight passes cost half of
// backward[c] each (on chunk 0, nothing and all of it: the first chunk's
// input needs no gradient), and a stage runs its next due weight passes
// while the input of its next action has not arrived, as the stage server
// does. The partitioner uses it to compare cuts. INVALID_ARGUMENT for what
// BuildSchedule refuses, or costs not one per model chunk.
// What moving a micro-batch's tensors between model chunks c and c + 1 costs
// where they sit on different stages: seconds[c] of the link's time (bytes
// over bandwidth) each way, one transfer at a time on each link and
// direction, then `latency` more until it arrives. Empty: no time.
struct Transfers {
  std::vector<double> seconds;
  double latency = 0;
};
StatusOr<double> SimulateStep(v1::ScheduleKind kind, int stages, int micro_batches, int virtual_stages,
                              const std::vector<double>& forward, const std::vector<double>& backward,
                              const Transfers& transfers = {});

// "F0 F1 B0 ..." ("F1.0" for chunk 1, micro-batch 0 when v > 1) for logs and tests.
std::string ToString(const std::vector<Action>& actions);

}  // namespace conveyor
