// The logic of one pipeline stage, free of gRPC: the layers it owns, their
// optimizer, the data it reads (first stage: inputs, last stage: labels) and
// the schedule it runs each step.
//
// Thread-safe. Every call but Abort() and Info() runs on the stage's own
// executor thread, which owns the model; callers block until it is done.
// Abort() wakes a step that waits for a neighbour. Torch-free header (pimpl).
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "conveyor.pb.h"
#include "transport/transport.h"

namespace conveyor {

class Inbox;

struct StageOptions {
  std::string device = "cpu";  // "cpu", "cuda", "cuda:N"
  int threads = 0;             // LibTorch intra-op threads; 0: LibTorch's default
  // Creates the links to the neighbours. Not owned; outlives the stage.
  TransportFactory* transports = nullptr;
  // Where this stage keeps its checkpoints; "" cannot checkpoint.
  std::string checkpoint_dir;
  // Where a job's profile_step writes this stage's trace; "" : checkpoint_dir.
  std::string profile_dir;
  // The only folders whose files (models, data, weights) this stage reads;
  // none: no confinement (see ResolveJobPaths in common/job_spec.h).
  std::vector<std::string> data_roots;
};

class Stage {
 public:
  // INVALID_ARGUMENT for an unknown device, FAILED_PRECONDITION for a CUDA
  // device in a build or on a machine without CUDA.
  static StatusOr<std::unique_ptr<Stage>> Create(const StageOptions& options);
  ~Stage();
  Stage(const Stage&) = delete;
  Stage& operator=(const Stage&) = delete;

  // Builds layers alone and says what per-sample shape they output; keeps
  // nothing (the coordinator chains these to learn every chunk's shapes).
  StatusOr<v1::ProbeReply> Probe(const v1::ProbeRequest& request);
  // Measures every layer of the model on this stage's device: parameters,
  // and with `time` the forward + backward seconds of one micro-batch.
  StatusOr<v1::ProfileReply> Profile(const v1::ProfileRequest& request);
  // What the files a job names hold: the model's layers (a TorchScript
  // archive is read here) and the data's per-sample shapes and dtypes.
  StatusOr<v1::DescribeReply> Describe(const v1::JobSpec& spec);
  // Builds this stage's chunks for a job (replacing any earlier job), checks
  // their shapes, loads the data it reads, makes its optimizer.
  StatusOr<v1::ConfigureReply> Configure(const v1::StageAssignment& assignment);
  // The upstream end of an NCCL link: makes the ids of the link's two
  // communicators (activations, gradients), keeps them for Connect and
  // returns them for the downstream neighbour's Connect. FAILED_PRECONDITION
  // where this stage cannot use NCCL.
  StatusOr<v1::LinkSetup> PrepareLink(const v1::JobRef& job);
  // Opens the long-lived links to both neighbours (the upstream one as
  // `job.upstream_link` says, the downstream one as PrepareLink made it).
  StatusOr<v1::ConnectReply> Connect(const v1::JobRef& job);
  // Runs one step's action list: forward and backward of every micro-batch,
  // then the optimizer step (train), or forward only (eval); with `checkpoint`
  // it then writes the checkpoint of step + 1 steps done.
  StatusOr<v1::RunStepReply> RunStep(const v1::RunStepRequest& request);
  StatusOr<v1::DigestReply> GetDigest(const v1::JobRef& job);
  StatusOr<v1::ParametersReply> GetParameters(const v1::JobRef& job);
  // Puts parameters, buffers, optimizer state and RNG back to the checkpoint
  // of `step` (Configure alone gives the initial parameters).
  StatusOr<v1::LoadCheckpointReply> LoadCheckpoint(const v1::LoadCheckpointRequest& request);
  // Fails the step in progress (if any) with `reason`; safe from any thread.
  Status Abort(const v1::AbortRequest& request);
  // Drops the job: layers, optimizer, links.
  Status Release(const v1::JobRef& job);
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
