// The data plane as the stage sees it: send a frame to a neighbour. Frames from
// neighbours arrive in the stage's Inbox, whichever transport carried them.
//
// Implementations: InProcTransport (tests, one process) and GrpcTransport
// (long-lived client streams to the neighbours' StageData service).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "common/status.h"
#include "conveyor.pb.h"

namespace conveyor {

class Inbox;

enum class Peer { kUpstream, kDownstream };

// Thread-safe.
class Transport {
 public:
  virtual ~Transport() = default;
  // Queues `frame` for the neighbour and returns at once. An error means the
  // link is broken (the neighbour went away); the frame is dropped.
  virtual Status Send(Peer peer, v1::TensorFrame frame) = 0;
  // What the links use: "grpc", "inproc".
  virtual std::string Name() const = 0;
  // Closes the links, idempotent. Queued frames may be dropped.
  virtual void Shutdown() = 0;
};

// Creates a stage's links to its neighbours (addresses in the assignment).
class TransportFactory {
 public:
  virtual ~TransportFactory() = default;
  virtual StatusOr<std::unique_ptr<Transport>> Connect(const v1::StageAssignment& assignment,
                                                       std::chrono::steady_clock::time_point deadline) = 0;
};

}  // namespace conveyor
