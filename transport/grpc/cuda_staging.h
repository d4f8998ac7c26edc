// Copies between a CUDA tensor and pinned host memory on a side stream of the
// tensor's device, piece by piece, so that host work on one piece (writing it
// to gRPC, or filling the next) overlaps the copy of another. For the gRPC
// stream's GPU ends. Built with CUDA only (cuda_staging_cuda.cpp); elsewhere
// every Start fails with FAILED_PRECONDITION.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Event.h>

#include <memory>

#include "common/status.h"

namespace conveyor {

// Device to host, for a sender.
class DeviceToHostCopy {
 public:
  // Starts copying `src` (contiguous, CUDA) into pinned host memory in pieces
  // of `piece` bytes, after `ready` (if any) on the side stream.
  static StatusOr<std::unique_ptr<DeviceToHostCopy>> Start(const at::Tensor& src, const c10::Event* ready,
                                                           int64_t piece);
  virtual ~DeviceToHostCopy() = default;
  // Waits until piece `i` is on the host; its bytes start at host() + i * piece.
  virtual Status Wait(int i) = 0;
  virtual const char* host() const = 0;
};

// Host to device, for a receiver: the host fills pinned memory piece by
// piece, each piece is copied on to the device as soon as it is committed.
class HostToDeviceCopy {
 public:
  // Room for all of `dst`'s bytes (contiguous, CUDA).
  static StatusOr<std::unique_ptr<HostToDeviceCopy>> Start(const at::Tensor& dst);
  virtual ~HostToDeviceCopy() = default;
  virtual char* host() = 0;
  // Copies bytes [offset, offset + n) on to the device, asynchronously.
  virtual Status Commit(int64_t offset, int64_t n) = 0;
  // Waits until every committed piece is on the device.
  virtual Status Finish() = 0;
};

}  // namespace conveyor
