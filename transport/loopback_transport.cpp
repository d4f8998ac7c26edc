#include "transport/loopback_transport.h"

#include "transport/tensor_payload.h"

namespace conveyor {

Status LoopbackTransport::Send(Peer, Frame frame) {
  if (frame.payload) frame.payload = CopyPayload(*frame.payload);
  return inbox_->Deliver(std::move(frame));
}

}  // namespace conveyor
