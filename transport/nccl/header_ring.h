// Frame headers of an NCCL link through shared memory, for two stages on one
// host: the link's gRPC stream is then off the path of every transfer. A
// header taking a gRPC stream crosses three or four threads (the sender's
// link thread, gRPC's poller and handler, the receiver's fetcher), each a
// wake-up of tens of microseconds on a virtual machine; a header in shared
// memory is seen by a consumer that spins on it for a while after each one.
//
// One POSIX shared memory segment per link holds two single-producer
// single-consumer rings of fixed slots: activations (the upstream stage
// writes) and gradients (the downstream stage writes). The upstream stage
// creates it when it prepares the link, before the coordinator hands the
// link to the downstream stage, which attaches to it before it joins the
// link's NCCL communicators and marks it attached. Once a communicator is up
// both ends have passed that point, so the upstream stage reads attached()
// then and both agree on where headers go: a downstream stage on another
// host (or without the same /dev/shm) does not attach, and both keep the
// gRPC stream.
//
// A consumer that finds its ring empty spins for a while, then sleeps on a
// futex in the segment that the producer wakes. A dead producer leaves the
// consumer waiting: the stage's own deadlines (Inbox::Take) report it.
//
// Linux only (futexes). Torch-free.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "common/status.h"

namespace conveyor {

struct RingSegment;  // the shared memory's layout (header_ring.cpp)
struct RingState;

// One direction. Thread-safe for one producer thread and one consumer
// thread; Close() from any thread of either process.
class HeaderRing {
 public:
  using Clock = std::chrono::steady_clock;

  // The largest header a slot holds.
  static constexpr int64_t kMaxBytes = 4000;

  // Producer: copies `bytes` into the next slot. Waits while the ring is full
  // (the consumer is that far behind), until `deadline`: DEADLINE_EXCEEDED.
  // INVALID_ARGUMENT over kMaxBytes; CANCELLED once closed.
  Status Push(const std::string& bytes, Clock::time_point deadline);

  // Consumer: the next header, or nullopt after `wait` with none. Spins
  // first (see SetSpin), then sleeps. CANCELLED once closed and empty.
  StatusOr<std::optional<std::string>> Pop(std::chrono::microseconds wait);

  // Ends the ring for both ends: Push fails, Pop fails once it is empty, and
  // a sleeping consumer wakes. Idempotent.
  void Close();

  // How long Pop spins before it sleeps (default 200 us).
  void SetSpin(std::chrono::microseconds spin) { spin_ = spin; }

 private:
  friend class LinkRings;
  explicit HeaderRing(RingState* state) : state_(state) {}
  RingState* state_;  // in the segment
  std::chrono::microseconds spin_{200};
};

// The segment of one link. Owns its mapping; the name is unlinked as soon as
// both ends hold it (or by the creator's destructor).
class LinkRings {
 public:
  // The segment's name for the link whose activations' NCCL id is `nccl_id`
  // (random per link and per setup).
  static std::string NameFor(const std::string& nccl_id);

  // The upstream end: creates the segment. UNAVAILABLE if shared memory
  // cannot be had; the link then keeps its headers on gRPC.
  static StatusOr<std::unique_ptr<LinkRings>> Create(const std::string& name);
  // The downstream end: attaches to it and marks it attached. NOT_FOUND
  // when there is no such segment here (the upstream stage is elsewhere).
  static StatusOr<std::unique_ptr<LinkRings>> Attach(const std::string& name);

  ~LinkRings();
  LinkRings(const LinkRings&) = delete;
  LinkRings& operator=(const LinkRings&) = delete;

  // Whether the downstream end attached (see the file comment for when the
  // upstream end may trust a false).
  bool attached() const;
  HeaderRing& activations() { return activations_; }
  HeaderRing& gradients() { return gradients_; }
  // Closes both rings.
  void Close();

 private:
  LinkRings(std::string name, RingSegment* segment, bool creator);
  std::string name_;
  RingSegment* segment_;
  bool unlinked_;
  HeaderRing activations_, gradients_;
};

}  // namespace conveyor
