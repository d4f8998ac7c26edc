// libFuzzer target: what a stage does with the bytes of a neighbour's stream
// message: parse a TensorFrame and hand it to the inbox (the same checks as
// the gRPC receive path), then take it as the stage would.
#include <cstddef>
#include <cstdint>

#include "common/wire.h"
#include "stage_server/inbox.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  conveyor::v1::TensorFrame frame;
  if (!frame.ParseFromArray(data, static_cast<int>(size))) return 0;
  conveyor::InboxExpectations expect;
  expect.job_id = "job-1";
  expect.stage_index = 1;
  expect.num_stages = 3;
  expect.activation_shapes[1] = {3, 4};
  expect.gradient_shapes[1] = {5};
  expect.max_micro_batches = 4;
  expect.max_micro_batch_size = 8;
  conveyor::Inbox inbox;
  inbox.Open(expect);
  inbox.BeginStep(conveyor::v1::PHASE_TRAIN, 0);
  const auto kind = frame.kind();
  const int chunk = frame.chunk(), mb = frame.micro_batch();
  if (inbox.Deliver(std::move(frame)).ok()) {
    auto taken = inbox.Take(kind, chunk, mb, conveyor::Inbox::Clock::now());
    if (!taken.ok()) __builtin_trap();  // delivered frames must be there to take
  }
  return 0;
}
