// transport/: the data plane, how activations and gradients move between
// neighbouring stages. As the stage sees it: send a frame (header and
// payload) to a neighbour; frames from neighbours arrive in the stage's Inbox
// (inbox.h), which checks them against what the stage expects, whichever
// transport carried them.
//
// Implementations: InProcTransport (tests, one process), LoopbackTransport (a
// one-stage job's chunks sending to themselves), GrpcTransport (grpc/: the chunked
// gRPC stream to each neighbour's StageData service, and NCCL, nccl/, for the
// payloads of links set up for it), DelayedTransport (timing noise).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "common/status.h"
#include "conveyor.pb.h"
#include "transport/frame.h"

namespace conveyor {

class Inbox;

// Thread-safe.
class Transport {
 public:
  virtual ~Transport() = default;
  // Queues `frame` for the neighbour and returns at once. The payload is a
  // TensorPayload (tensor_payload.h) or a HostPayload; the transport keeps it
  // until its bytes are sent, and waits (on the device, never the host
  // thread of the caller) for its ready event before reading them. An error
  // means the link is broken (the neighbour went away); the frame is dropped.
  virtual Status Send(Peer peer, Frame frame) = 0;
  // OK while every link works; why the first broken one broke otherwise. A
  // link can break after the frames of a step were handed over (an NCCL
  // transfer still in flight), so a stage asks again once its step is done.
  virtual Status status() const { return absl::OkStatus(); }
  // What the link to `peer` uses (a delayed link: what it wraps).
  virtual v1::LinkKind Kind(Peer peer) const = 0;
  // Closes the links, idempotent. Queued frames may be dropped.
  virtual void Shutdown() = 0;
};

// How a stage's links are to be made, besides the neighbours' addresses.
// NCCL's knobs, from the job (nccl_ctas, nccl_headers).
struct NcclOptions {
  int ctas = 0;             // thread blocks per communicator (0: NCCL's default)
  bool shm_headers = true;  // frame headers through shared memory where both ends share a host (header_ring.h)
};

// What a factory made for a stage's downstream link before its neighbour
// connects (an NCCL link's shared-memory header rings): opaque to the stage,
// which hands it back in LinkOptions.
class PreparedLink {
 public:
  virtual ~PreparedLink() = default;
};

struct LinkOptions {
  v1::LinkSetup upstream;    // from the coordinator's Connect
  v1::LinkSetup downstream;  // from this stage's own PrepareLink
  std::string device;        // this stage's device ("cpu", "cuda:N")
  Inbox* inbox = nullptr;    // where payloads fetched apart (NCCL) are delivered
  std::chrono::duration<double> timeout{10};  // the job's stage_timeout
  NcclOptions nccl;
  // What PrepareLink made with `downstream` (null: nothing). Shared with the links.
  std::shared_ptr<PreparedLink> prepared;
};

class TransportFactory {
 public:
  virtual ~TransportFactory() = default;
  // The setup of a stage's downstream NCCL link, made before the neighbour
  // hears of it (its ids; the shared memory for its headers where
  // `nccl.shm_headers`, into *prepared). FAILED_PRECONDITION saying why where
  // this device or build cannot use NCCL.
  virtual StatusOr<v1::LinkSetup> PrepareLink(const std::string& device, const NcclOptions& nccl,
                                              std::shared_ptr<PreparedLink>* prepared);
  virtual StatusOr<std::unique_ptr<Transport>> Connect(const v1::StageAssignment& assignment,
                                                       const LinkOptions& options,
                                                       std::chrono::steady_clock::time_point deadline) = 0;
  // Whether links made here can use NCCL on a CUDA device (NCCL built in).
  virtual bool SupportsNccl() const { return false; }
};

inline StatusOr<v1::LinkSetup> TransportFactory::PrepareLink(const std::string& device, const NcclOptions&,
                                                             std::shared_ptr<PreparedLink>*) {
  return absl::FailedPreconditionError(device + " cannot use NCCL (these links have no NCCL)");
}

}  // namespace conveyor
