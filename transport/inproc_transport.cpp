#include "transport/inproc_transport.h"

#include "transport/inbox.h"
#include "transport/tensor_payload.h"

namespace conveyor {
namespace {

class InProcTransport : public Transport {
 public:
  InProcTransport(Inbox* up, Inbox* down) : up_(up), down_(down) {}

  // The receiver gets a copy: stages never share a tensor's memory.
  Status Send(Peer peer, Frame frame) override {
    Inbox* to = peer == Peer::kUpstream ? up_ : down_;
    if (!to) return absl::FailedPreconditionError("no neighbour on that side");
    if (frame.payload) frame.payload = CopyPayload(*frame.payload);
    frame.header.set_to_upstream(peer == Peer::kUpstream);
    return to->Deliver(std::move(frame));
  }
  v1::LinkKind Kind(Peer) const override { return v1::LINK_IN_PROCESS; }
  void Shutdown() override {}

 private:
  Inbox* up_;
  Inbox* down_;
};

}  // namespace

void InProcFabric::Register(const std::string& address, Inbox* inbox) {
  std::lock_guard<std::mutex> lock(mu_);
  inboxes_[address] = inbox;
}

Inbox* InProcFabric::Find(const std::string& address) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = inboxes_.find(address);
  return it == inboxes_.end() ? nullptr : it->second;
}

StatusOr<std::unique_ptr<Transport>> InProcFabric::Connect(const v1::StageAssignment& a, const LinkOptions& options,
                                                           std::chrono::steady_clock::time_point) {
  if (options.upstream.transport() == v1::TRANSPORT_NCCL || options.downstream.transport() == v1::TRANSPORT_NCCL)
    return absl::FailedPreconditionError("in-process stages have no NCCL links");
  Inbox* up = nullptr;
  Inbox* down = nullptr;
  if (!a.upstream().empty() && !(up = Find(a.upstream())))
    return absl::UnavailableError("no in-process stage at " + a.upstream());
  if (!a.downstream().empty() && !(down = Find(a.downstream())))
    return absl::UnavailableError("no in-process stage at " + a.downstream());
  return std::unique_ptr<Transport>(new InProcTransport(up, down));
}

}  // namespace conveyor
