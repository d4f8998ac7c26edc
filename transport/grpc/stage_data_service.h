// The receiving half of the gRPC transport: StageData, the streams from the
// neighbours, read by gRPC's synchronous server (a thread per stream) and fed
// into a stage's Inbox. The sending half is grpc_transport.h. Thin: no logic
// beyond status conversion.
//
// Not gRPC's callback API: a server with a callback method makes gRPC 1.51
// start a completion queue of its own, polled by two "nexting" threads that
// sleep 100 ms whenever they have waited a second for an event. A connection
// that gRPC gave to that queue's poll set was then read by nobody for those
// 100 ms: a stage server's step request from the coordinator sat unread about
// once a second (W1 on two H100s, 34.4 ms steps: one step in ten to fifteen
// took 66 to 86 ms; on the CPU every 1.1 s a 100 ms stall). See
// bench/RESULTS.md (2x H100, 2026-11-27).
#pragma once

#include <grpcpp/impl/service_type.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/sync_stream.h>

#include <string>
#include <utility>

#include "conveyor.pb.h"
#include "transport/inbox.h"

namespace conveyor {

// Push: protobuf frames. PushChunks: a raw method (gRPC's buffers, no
// protobuf parse of the bytes), read by a ChunkReceiver that assembles the
// tensors on `device`. The methods and messages of StageData in
// conveyor.proto; the senders use its generated stub.
class StageDataService final : public grpc::Service {
 public:
  StageDataService(Inbox* inbox, std::string device);

 private:
  grpc::Status Push(grpc::ServerReader<v1::TensorFrame>* reader, v1::PushReply* reply);
  grpc::Status PushChunks(grpc::ServerReader<grpc::ByteBuffer>* reader, grpc::ByteBuffer* reply);

  Inbox* inbox_;  // not owned
  const std::string device_;
};

}  // namespace conveyor
