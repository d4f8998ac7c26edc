// stage_server/: one pipeline stage as a process, where the training happens.
// It holds a chunk of the model on its device with its optimizer, runs each
// step's action list (step_runner.cpp), sends and receives frames through
// ../transport, sums gradients with its replicas (replica_group.h), and writes
// and restores checkpoints (stage_state.cpp, checkpoint.h).
//
// Stage is the logic of one pipeline stage, free of gRPC: the layers it owns,
// their optimizer, the data it reads (first stage: inputs, last stage:
// labels) and the schedule it runs each step.
//
// Thread-safe. Every call but Abort() and Info() runs on the stage's own
// executor thread, which owns the model; callers block until it is done.
// Abort() wakes a step that waits for a neighbour. Torch-free header (pimpl).
#pragma once

#include <memory>
#include <string>

#include "common/clock.h"
#include "common/status.h"
#include "conveyor.pb.h"
#include "proto/stage_control_ops.h"
#include "transport/transport.h"

namespace conveyor {

class Inbox;

struct StageOptions {
  std::string device = "cpu";  // "cpu", "cuda", "cuda:N"
  int threads = 0;             // LibTorch intra-op threads; 0: DefaultComputeThreads (model/device.h)
  // Creates the links to the neighbours. Not owned; outlives the stage.
  TransportFactory* transports = nullptr;
  // Where this stage keeps its checkpoints; "" cannot checkpoint.
  std::string checkpoint_dir;
  // Where a job's profile_step writes this stage's trace; "" : checkpoint_dir.
  std::string profile_dir;
  // The only folders whose files (models, data, weights) this stage reads;
  // none: no confinement (see ResolveJobPaths in common/job_spec.h).
  std::vector<std::string> data_roots;
  // The time its waits for the neighbours (stage_timeout) are judged by;
  // null: the steady clock. Tests inject a FakeClock. Not owned.
  Clock* clock = nullptr;
};

class Stage {
 public:
  // INVALID_ARGUMENT for an unknown device, FAILED_PRECONDITION for a CUDA
  // device in a build or on a machine without CUDA.
  static StatusOr<std::unique_ptr<Stage>> Create(const StageOptions& options);
  ~Stage();
  Stage(const Stage&) = delete;
  Stage& operator=(const Stage&) = delete;

  // The operations of proto/stage_control_ops.h (what each does is said
  // there): each takes its request and returns its reply; the kExecutor ones
  // run on the stage's executor, which owns the model, the kAnyThread ones on
  // the calling thread.
#define CONVEYOR_STAGE_METHOD(Name, Request, Reply, Thread, How) StatusOr<Reply> Name(const Request& request);
  CONVEYOR_STAGE_CONTROL_OPS(CONVEYOR_STAGE_METHOD)
#undef CONVEYOR_STAGE_METHOD
  // GetInfo's reply, directly.
  v1::StageInfo Info() const;

  // Where the transports deliver this stage's incoming frames.
  Inbox& inbox();

  // Idempotent; Abort()s the running step and joins the executor.
  void Shutdown();

 private:
  class Impl;
  explicit Stage(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace conveyor
