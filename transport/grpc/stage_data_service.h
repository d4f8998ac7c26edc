// The receiving half of the gRPC transport: StageData, the streams from the
// neighbours, read with the callback API and fed into a stage's Inbox. The
// sending half is grpc_transport.h. Thin: no logic beyond status conversion.
#pragma once

#include <string>
#include <utility>

#include "conveyor.grpc.pb.h"
#include "transport/inbox.h"

namespace conveyor {

// Push: protobuf frames. PushChunks: a raw method (gRPC's buffers, no
// protobuf parse of the bytes), read by a ChunkReceiver that assembles the
// tensors on `device`.
class StageDataService final : public v1::StageData::WithRawCallbackMethod_PushChunks<v1::StageData::CallbackService> {
 public:
  StageDataService(Inbox* inbox, std::string device) : inbox_(inbox), device_(std::move(device)) {}
  grpc::ServerReadReactor<v1::TensorFrame>* Push(grpc::CallbackServerContext* context,
                                                 v1::PushReply* reply) override;
  grpc::ServerReadReactor<grpc::ByteBuffer>* PushChunks(grpc::CallbackServerContext* context,
                                                        grpc::ByteBuffer* reply) override;

 private:
  Inbox* inbox_;  // not owned
  const std::string device_;
};

}  // namespace conveyor
