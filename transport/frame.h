// One tensor between neighbouring stages as the transports and the Inbox see
// it: a small header and the tensor's bytes as an opaque payload, so that no
// transport needs a protobuf copy of them. Torch-free (the fuzz targets use it).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "conveyor.pb.h"

namespace conveyor {

// A stage's two neighbours: the stage before it in the chain and the one
// after it.
enum class Peer { kUpstream, kDownstream };

// The bytes of a frame's tensor. Torch-free code sees only their size; the
// stage and the transports know the concrete kinds: HostPayload below, and
// TensorPayload (tensor_payload.h), a LibTorch tensor, possibly on a GPU.
class Payload {
 public:
  virtual ~Payload() = default;
  virtual int64_t bytes() const = 0;
};

// Host bytes in a string: what a protobuf TensorFrame carried.
class HostPayload final : public Payload {
 public:
  explicit HostPayload(std::string data) : data_(std::move(data)) {}
  int64_t bytes() const override { return static_cast<int64_t>(data_.size()); }
  std::string& data() { return data_; }
  const std::string& data() const { return data_; }

 private:
  std::string data_;
};

struct Frame {
  // Job, phase, step, micro-batch, kind, chunk, carrier; header.tensor() has
  // dtype and shape, never data.
  v1::TensorFrame header;
  // The tensor's bytes; null only for a header whose carrier brings them
  // separately (NCCL) and that has not been fetched yet.
  std::unique_ptr<Payload> payload;

  // A protobuf TensorFrame's data moves into a HostPayload, without a copy.
  static Frame FromProto(v1::TensorFrame proto) {
    Frame f;
    f.payload = std::make_unique<HostPayload>(std::move(*proto.mutable_tensor()->mutable_data()));
    proto.mutable_tensor()->clear_data();
    f.header = std::move(proto);
    return f;
  }
};

// Fetches payloads that travel apart from their headers (NCCL): the inbox
// hands it each such header once the header passed its checks; the fetcher
// delivers the whole frame to the inbox when its bytes are here.
class PayloadFetcher {
 public:
  virtual ~PayloadFetcher() = default;
  // Called with the inbox's lock held: must only queue the work, never call
  // back into the inbox from this call.
  virtual Status Fetch(v1::TensorFrame header) = 0;
};

}  // namespace conveyor
