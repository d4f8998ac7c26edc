// The receiving end of one chunked stream (StageData.PushChunks): parses each
// message, checks the frame's header with the inbox before it makes room for
// the bytes, assembles them into one tensor on the stage's device (through
// pinned staging and a side stream on a GPU) and delivers the whole frame.
// Headers whose bytes come over NCCL go to the inbox as they are.
//
// One per stream, used by one thread at a time. Torch-free header.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "transport/grpc/chunk_codec.h"

namespace conveyor {

class Inbox;

class ChunkReceiver {
 public:
  // `inbox` is not owned and outlives the receiver; `device` is the stage's.
  ChunkReceiver(Inbox* inbox, const std::string& device);
  ~ChunkReceiver();
  ChunkReceiver(const ChunkReceiver&) = delete;
  ChunkReceiver& operator=(const ChunkReceiver&) = delete;

  // One message, held in `spans`. An error ends the stream: INVALID_ARGUMENT
  // or RESOURCE_EXHAUSTED for a malformed chunk, or the inbox's refusal.
  Status OnMessage(const std::vector<Span>& spans);
  // Frames delivered so far.
  int64_t frames() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace conveyor
