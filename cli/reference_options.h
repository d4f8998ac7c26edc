// `conveyor train --reference` as the torch-free CLI sees it: the options of
// the single-process reference trainer (cli/reference.h, in the
// conveyor_reference target, the CLI's only LibTorch code) and the function
// that conveyor_main.cpp hands to cli::Main to run it.
#pragma once

#include <functional>
#include <string>

#include "common/status.h"
#include "conveyor.pb.h"

namespace conveyor::cli {

struct ReferenceOptions {
  std::string device = "cpu";
  // Called after every step with the status so far (state RUNNING).
  std::function<void(const v1::JobStatus&)> progress;
  // Where the job's profile_step writes its trace.
  std::string profile_dir = ".";
  // RunReference only: intra-op threads for the process (model/device.h's
  // SetComputeThreads); 0 picks DefaultComputeThreads for the device.
  int threads = 0;
  // Read each step's loss and gradient norm after the next step is launched,
  // as the reference does on CUDA without loss scaling, on any device. For
  // tests: the deferred read and its clock, off the GPU.
  bool defer_reads = false;
};

// Runs the reference and returns what a pipelined job reports.
using ReferenceTrainer = std::function<StatusOr<v1::JobStatus>(const v1::JobSpec&, const ReferenceOptions&)>;

// The ReferenceTrainer of the `conveyor` binary: sets the compute threads,
// then TrainReference (cli/reference.h). Defined in conveyor_reference.
StatusOr<v1::JobStatus> RunReference(const v1::JobSpec& spec, const ReferenceOptions& options);

}  // namespace conveyor::cli
