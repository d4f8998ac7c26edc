// A transport inside one process: Send() hands the frame straight to the
// neighbour's Inbox, found by address in a shared InProcFabric. For tests and
// in-process runs; exercises the same Inbox checks as the gRPC path.
#pragma once

#include <map>
#include <mutex>

#include "transport/transport.h"

namespace conveyor {

// Thread-safe registry of inboxes by address. Outlives every transport made
// from it; the inboxes outlive their registration.
class InProcFabric : public TransportFactory {
 public:
  void Register(const std::string& address, Inbox* inbox);
  Inbox* Find(const std::string& address) const;

  StatusOr<std::unique_ptr<Transport>> Connect(const v1::StageAssignment& assignment, const LinkOptions& options,
                                               std::chrono::steady_clock::time_point deadline) override;

 private:
  mutable std::mutex mu_;  // guards inboxes_
  std::map<std::string, Inbox*> inboxes_;
};

}  // namespace conveyor
