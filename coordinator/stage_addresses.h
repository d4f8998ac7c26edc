// The coordinator's --stages: stage server addresses in pipeline order, where
// an item may be a pattern that stands for several, so that an orchestrator's
// stable names need not be listed one by one:
//
//   stage-{0..3}.stages.conveyor.svc:50051
//     -> stage-0.stages.conveyor.svc:50051, ..., stage-3.stages.conveyor.svc:50051
//
// One {A..B} per item, A <= B, both decimal; bounds written with a leading
// zero pad every number to the wider bound's width ({08..10}: 08, 09, 10), as
// bash does. Names are not looked up here: each job's start resolves them
// (StageClient::Reconnect), and gRPC again after a connection breaks, so a
// pod that restarts at a new IP is found by its name.
// Torch-free.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace conveyor {

// At most this many addresses in all.
constexpr int kMaxStageAddresses = 4096;

// `items` expanded in order; each address is checked as CheckAddress does.
// INVALID_ARGUMENT naming the item and what is wrong with it (an unclosed
// brace, a range that counts down, a bound that is not a number, two ranges).
StatusOr<std::vector<std::string>> ExpandStageAddresses(const std::vector<std::string>& items);

}  // namespace conveyor
