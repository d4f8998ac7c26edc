// A one-stage job's links: its chunks pass tensors to themselves (one chunk,
// or several when interleaved). Send delivers a copy of the frame's tensor,
// as a neighbour would receive it, to the stage's own inbox, so that the step
// code sends and receives the same way whatever the number of stages.
#pragma once

#include "transport/inbox.h"
#include "transport/transport.h"

namespace conveyor {

class LoopbackTransport : public Transport {
 public:
  // `inbox` must outlive the transport.
  explicit LoopbackTransport(Inbox* inbox) : inbox_(inbox) {}

  Status Send(Peer peer, Frame frame) override;
  v1::LinkKind Kind(Peer) const override { return v1::LINK_NONE; }
  void Shutdown() override {}

 private:
  Inbox* inbox_;
};

}  // namespace conveyor
