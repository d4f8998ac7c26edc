// libFuzzer target: what a stage does with the bytes of a neighbour's stream
// message: parse a TensorFrame and hand it to the inbox (the same checks as
// the gRPC receive path), then take it as the stage would.
#include <cstddef>
#include <cstdint>

#include "common/wire.h"
#include "bench/fuzz/fuzz_inbox.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  conveyor::v1::TensorFrame frame;
  if (!frame.ParseFromArray(data, static_cast<int>(size))) return 0;
  conveyor::Inbox inbox;
  conveyor::fuzz::OpenFuzzInbox(&inbox);
  const auto kind = frame.kind();
  const auto phase = frame.phase();
  const int64_t step = frame.step();
  const int chunk = frame.chunk(), mb = frame.micro_batch();
  if (inbox.Deliver(std::move(frame)).ok()) {
    // The inbox also holds frames a neighbour sent ahead: the next step's, or
    // the first evaluation batch's. They are taken once that step begins.
    inbox.BeginStep(phase, step);
    auto taken = inbox.Take(kind, chunk, mb, conveyor::Inbox::Clock::now());
    if (!taken.ok()) __builtin_trap();  // delivered frames must be there to take
  }
  return 0;
}
