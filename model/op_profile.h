// One span of work under LibTorch's Kineto profiler: every operator on the
// host and, on CUDA, every kernel and copy on the device, written as a Chrome
// trace (chrome://tracing, Perfetto; bench/profile_summary.py tabulates it).
// For `profile_step` (docs/jobs.md): a stage or the reference profiles one
// training step. Torch-free header.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"

namespace conveyor {

class OpProfile {
 public:
  // Starts profiling this process (host operators; device kernels too when
  // `cuda`). One profile at a time per process: FAILED_PRECONDITION otherwise.
  static StatusOr<std::unique_ptr<OpProfile>> Start(bool cuda);
  ~OpProfile();  // stops without writing, if Finish was not called

  // Stops and writes the trace to `path` (its folder is created).
  Status Finish(const std::string& path);

 private:
  OpProfile() = default;
  bool running_ = false;
};

// "<dir>/<job>-step<N>-<who>.json": where a profile of step N goes.
std::string ProfilePath(const std::string& dir, const std::string& job, int64_t step, const std::string& who);

}  // namespace conveyor
