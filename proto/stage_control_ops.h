// The operations of the StageControl service (conveyor.proto), listed once.
//
// Every piece of code around a stage operation is generated from this table:
// the Stage facade and its executor forwarding (stage_server/stage.h), the
// declarations of its logic (stage_server/stage_impl.h), the gRPC adapter
// (stage_server/stage_service.h), and the coordinator's clients of a stage,
// over gRPC and in-process (coordinator/stage_client.h,
// tests/support/in_process.cpp). A new operation is written in three places:
// its rpc in conveyor.proto, its row here, and its logic, Stage::Impl::Name.
//
// X(Name, Request, Reply, Thread, How)
//   Thread  kExecutor: runs on the stage's executor, which owns the model;
//           kAnyThread: runs on the calling thread (it must not wait for
//           the executor: Abort ends the step the executor is running);
//           kLaunch: the executor launches it (Stage::Impl::Launch<Name>)
//           and the calling thread waits for its end (Finish<Name>), so
//           that the executor launches the next one meanwhile.
//   How     how the coordinator calls it: kWaitForReady waits for a
//           connection that is still coming up, within the deadline;
//           kFailFast fails at once when the stage is unreachable (an abort
//           must not wait for a dead stage); kStep also can be cancelled
//           (StageClient::CancelSteps).
#pragma once

#define CONVEYOR_STAGE_CONTROL_OPS(X)                                                                          \
  /* Builds layers alone and says what per-sample shape they output (keeps nothing). */                     \
  X(Probe, v1::ProbeRequest, v1::ProbeReply, kExecutor, kWaitForReady)                                      \
  /* Every layer on this stage's device: parameters and, with `time`, forward + backward seconds. */        \
  X(Profile, v1::ProfileRequest, v1::ProfileReply, kExecutor, kWaitForReady)                                \
  /* What the files a job names hold: a TorchScript model's layers, a data file's shapes and dtypes. */    \
  X(Describe, v1::JobSpec, v1::DescribeReply, kExecutor, kWaitForReady)                                     \
  /* This stage's chunks of a job (replacing any earlier job): layers, data, optimizer. */                  \
  X(Configure, v1::StageAssignment, v1::ConfigureReply, kExecutor, kWaitForReady)                           \
  /* The upstream end of a link: ids and rings the downstream neighbour joins in its Connect. */             \
  X(PrepareLink, v1::JobRef, v1::LinkSetup, kExecutor, kWaitForReady)                                       \
  /* Opens the links to both neighbours. */                                                                 \
  X(Connect, v1::JobRef, v1::ConnectReply, kExecutor, kWaitForReady)                                        \
  /* One step's action list, then the optimizer step (train) or nothing more (eval). */                     \
  X(RunStep, v1::RunStepRequest, v1::RunStepReply, kLaunch, kStep)                                          \
  /* A deferred step's optimizer step: gradients times grad_scale (the same on every stage), then step. */  \
  X(ApplyStep, v1::ApplyStepRequest, v1::ApplyStepReply, kExecutor, kStep)                                  \
  X(GetDigest, v1::JobRef, v1::DigestReply, kExecutor, kWaitForReady)                                       \
  /* Parameters and buffers, named as the model's state_dict() names them. */                               \
  X(GetParameters, v1::JobRef, v1::ParametersReply, kExecutor, kWaitForReady)                               \
  /* The job's TorchScript archive with the given weights (the first stage builds it; the caller writes it). */ \
  X(ExportTorchScript, v1::TorchScriptRequest, v1::TorchScriptReply, kExecutor, kWaitForReady)              \
  /* Parameters, buffers, optimizer state and RNG back to the checkpoint of a step. */                      \
  X(LoadCheckpoint, v1::LoadCheckpointRequest, v1::LoadCheckpointReply, kExecutor, kWaitForReady)           \
  /* Writes the state as it stands, after its last whole optimizer step, as that step's checkpoint (commit_steps). */ \
  X(SaveState, v1::JobRef, v1::CheckpointRecord, kExecutor, kWaitForReady)                                 \
  /* A part of a checkpoint file this server holds (its own or a copy), for a stage that reshards. */       \
  X(ReadCheckpointFile, v1::CheckpointFileRequest, v1::CheckpointFilePart, kAnyThread, kWaitForReady)       \
  /* A part of another stage's checkpoint, kept here as a copy (whole once the last part is written). */    \
  X(WriteCheckpointCopy, v1::CheckpointFilePart, v1::Empty, kAnyThread, kWaitForReady)                      \
  /* Drops the job: layers, optimizer, links. */                                                            \
  X(Release, v1::JobRef, v1::Empty, kExecutor, kFailFast)                                                   \
  /* Fails the step in progress (if any) with a reason. */                                                  \
  X(Abort, v1::AbortRequest, v1::Empty, kAnyThread, kFailFast)                                              \
  /* Device, build and the job held. */                                                                     \
  X(GetInfo, v1::Empty, v1::StageInfo, kAnyThread, kWaitForReady)
