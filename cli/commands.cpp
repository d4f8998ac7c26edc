#include "cli/commands.h"

#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <sstream>
#include <thread>

#include "cli/checkpoint_export.h"
#include "cli/client.h"
#include "cli/curves.h"
#include "cli/export.h"
#include "cli/job_checks.h"
#include "cli/local_cluster.h"
#include "cli/local_command.h"
#include "cli/local_outputs.h"
#include "cli/output.h"
#include "cli/reference_options.h"
#include "cli/trace.h"
#include "common/command_line.h"
#include "common/files.h"
#include "plan/job_keys.h"
#include "plan/job_overrides.h"
#include "plan/job_spec.h"
#include "plan/placement.h"
#include "common/logging.h"
#include "common/net.h"
#include "common/security.h"
#include "common/server.h"
#include "conveyor.grpc.pb.h"
#include "health.grpc.pb.h"

namespace conveyor::cli {
namespace {

// ------------------------------------------------------------- commands --

int CmdSubmit(const Common& c, const std::string& file, bool wait) {
  std::string yaml;
  v1::JobSpec spec;
  bool printed = false;
  if (Status st = ReadJob(c, file, &yaml, &spec, &printed); !st.ok()) return Fail(st);
  if (printed) return 0;
  auto stub = Connect(CoordinatorAddress(c));
  auto id = SubmitText(*stub, yaml);
  if (!id.ok()) return Fail(Annotate(WithLocalPathHint(id.status(), spec, file), file));
  if (!wait) {
    if (c.json) std::cout << nlohmann::json{{"job_id", *id}}.dump() << std::endl;
    else std::cout << *id << std::endl;
    return 0;
  }
  std::cerr << "submitted " << *id << std::endl;
  // Its recovery_timeout bounds a wait for the coordinator.
  return WatchUntilDone(*stub, *id, c.json, spec.recovery_timeout_s() > 0 ? spec.recovery_timeout_s() : kDefaultRecoveryTimeoutS);
}


int CmdStatus(const Common& c, const std::string& job_id, bool wait, const std::string& metrics_csv) {
  auto stub = Connect(CoordinatorAddress(c));
  if (wait) return WatchUntilDone(*stub, job_id, c.json);
  v1::GetJobRequest req;
  req.set_job_id(job_id);
  v1::JobStatus status;
  Status st = Call(*stub, &v1::Coordinator::Stub::GetJob, req, &status);
  if (!st.ok()) return Fail(st);
  if (c.json) std::cout << ToJson(status).dump() << std::endl;
  else std::cout << Summary(status);
  if (metrics_csv.empty()) return 0;
  auto curves = FetchCurves(*stub, job_id);
  if (!curves.ok()) return Fail(curves.status());
  if (Status wrote = WriteCurvesCsv(*curves, metrics_csv); !wrote.ok()) return Fail(wrote);
  std::cerr << "wrote " << metrics_csv << ": " << Plural(curves->steps_size(), "training step") << ", "
            << Plural(curves->evals_size(), "evaluation") << "\n";
  return 0;
}

int CmdPlot(const Common& c, const std::string& job_id, std::string png) {
  auto stub = Connect(CoordinatorAddress(c));
  if (png.empty()) png = job_id + "-curves.png";
  if (Status st = DrawCurves(*stub, job_id, png, std::cout); !st.ok()) return Fail(st);
  return 0;
}

int CmdList(const Common& c) {
  auto stub = Connect(CoordinatorAddress(c));
  v1::ListJobsRequest req;
  req.set_with_losses(c.json);  // the same object as status --json
  v1::ListJobsReply reply;
  Status st = Call(*stub, &v1::Coordinator::Stub::ListJobs, req, &reply);
  if (!st.ok()) return Fail(st);
  if (c.json) {
    nlohmann::json all = nlohmann::json::array();
    for (const auto& j : reply.jobs()) all.push_back(ToJson(j));
    std::cout << all.dump() << std::endl;
    return 0;
  }
  if (reply.jobs().empty()) std::cout << "no jobs\n";
  for (const auto& j : reply.jobs()) std::cout << ListLine(j) << "\n";
  v1::ListStagesReply stages;
  if (Call(*stub, &v1::Coordinator::Stub::ListStages, v1::Empty(), &stages).ok()) std::cout << StagesLines(stages);
  return 0;
}

// A coordinator call that takes a job id and answers with the job's status
// (CancelJob, ResumeJob).
using JobCall = grpc::Status (v1::Coordinator::Stub::*)(grpc::ClientContext*, const v1::JobRef&, v1::JobStatus*);
StatusOr<v1::JobStatus> CallOnJob(const Common& c, JobCall method, const std::string& job_id) {
  auto stub = Connect(CoordinatorAddress(c));
  v1::JobRef req;
  req.set_job_id(job_id);
  v1::JobStatus status;
  CONVEYOR_RETURN_IF_ERROR(Call(*stub, method, req, &status));
  return status;
}

int CmdCancel(const Common& c, const std::string& job_id) {
  auto status = CallOnJob(c, &v1::Coordinator::Stub::CancelJob, job_id);
  if (!status.ok()) return Fail(status.status());
  if (IsTerminal(status->state())) {
    std::cout << job_id << " " << JobStateName(status->state()) << "\n";  // it was still queued
  } else {
    std::cout << "cancelling " << job_id << ": it stops after its current step\n";
  }
  return 0;
}

int CmdResume(const Common& c, const std::string& job_id, bool wait) {
  auto stub = Connect(CoordinatorAddress(c));
  v1::JobRef req;
  req.set_job_id(job_id);
  for (const std::string& s : c.sets) req.add_sets(s);
  v1::JobStatus resumed;
  if (Status st = Call(*stub, &v1::Coordinator::Stub::ResumeJob, req, &resumed); !st.ok()) return Fail(st);
  const v1::JobStatus* status = &resumed;
  // The event the coordinator added says where it goes on from.
  const std::string said = status->events().empty() ? std::string("queued") : status->events().rbegin()->text();
  std::cout << job_id << " " << said << "\n";
  return wait ? CmdStatus(c, job_id, /*wait=*/true, "") : 0;
}

// REQUIRES: --reference was given (Main refuses `train` without it).
int CmdTrain(const Common& c, const std::string& file, const std::string& device, int threads,
             const std::string& profile_dir, const ReferenceTrainer& train_reference) {
  std::string yaml;
  v1::JobSpec job;
  bool printed = false;
  if (Status st = ReadJob(c, file, &yaml, &job, &printed); !st.ok()) return Fail(st);
  if (printed) return 0;
  v1::JobSpec* spec = &job;
  if (Status files = ResolveJobPaths(spec, JobDataRoots(file)); !files.ok()) return Fail(Annotate(files, file));
  if (Status checked = CheckJobBeforeStart(*spec); !checked.ok()) return Fail(Annotate(checked, file));
  ProgressPrinter progress(true);
  ReferenceOptions options;
  options.device = device;
  options.threads = threads;
  options.profile_dir = profile_dir;
  options.progress = [&](const v1::JobStatus& s) { progress.Update(s); };
  auto result = train_reference(*spec, options);
  progress.Finish();
  if (!result.ok()) return Fail(result.status());
  return Report(*result, c.json);
}

int CmdTrace(const Common& c, const std::string& job_id, int64_t step, const std::string& prefix) {
  auto stub = Connect(CoordinatorAddress(c));
  return WriteStepTrace(*stub, job_id, step, prefix, std::cout);
}

// Gathers a job's weights from its stage servers (this process calls each
// one: it must reach them) and writes them to `out` on this host.
int CmdExport(const Common& c, const std::string& job_id, const std::string& out, const std::string& format) {
  auto stub = Connect(CoordinatorAddress(c));
  v1::GetJobRequest req;
  req.set_job_id(job_id);
  req.set_omit_losses(true);
  v1::JobStatus status;
  Status st = Call(*stub, &v1::Coordinator::Stub::GetJob, req, &status);
  if (!st.ok()) return Fail(st);
  auto wrote = ExportWeights(status, out, format);
  if (!wrote.ok()) return Fail(wrote.status());
  std::ostringstream said;
  said << "wrote " << out << ": " << wrote->tensors << " tensors (" << FormatBytes(wrote->bytes) << ") of " << job_id
       << " from " << wrote->stages << " stage(s)";
  if (format == "torchscript") said << " into its TorchScript archive";
  if (status.state() != v1::JOB_STATE_SUCCEEDED)
    said << "; the job is " << JobStateName(status.state()) << ": each stage gave its weights between two of its steps";
  std::cout << said.str() << "\n";
  return 0;
}

// The weights in checkpoint files, read and written by this process.
int CmdExportCheckpoints(const CheckpointExportOptions& options, const CheckpointExporter& export_checkpoints) {
  auto wrote = export_checkpoints(options);
  if (!wrote.ok()) return Fail(wrote.status());
  std::cout << "wrote " << options.out << ": " << wrote->tensors << " tensors (" << FormatBytes(wrote->bytes)
            << ") of " << wrote->job_id << " at step " << wrote->step << " from the checkpoints of " << wrote->stages
            << " stage(s)" << (options.format == "torchscript" ? " into its TorchScript archive" : "") << "\n";
  return 0;
}

// The standard health check; with `wait_s` > 0 it waits that long for a
// server that is still starting. A coordinator also lists its stage servers.
int CmdHealth(const std::string& address, double wait_s) {
  auto channel = MakeChannel(address);
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::health::v1::HealthCheckRequest req;
  grpc::health::v1::HealthCheckResponse reply;
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineAfter(wait_s > 0 ? wait_s : 5));
  ctx.set_wait_for_ready(wait_s > 0);
  grpc::Status st = stub->Check(&ctx, req, &reply);
  if (!st.ok()) {
    Status why = FromGrpc(st);
    if (wait_s > 0 && why.code() == absl::StatusCode::kDeadlineExceeded)
      why = absl::UnavailableError("no answer within " + FormatDuration(wait_s));
    return Fail(Unreachable(why, "the server", address));
  }
  std::cout << address << ": " << grpc::health::v1::HealthCheckResponse::ServingStatus_Name(reply.status()) << "\n";
  auto coordinator = v1::Coordinator::NewStub(channel);
  v1::ListStagesReply stages;
  grpc::ClientContext list_ctx;
  list_ctx.set_deadline(DeadlineAfter(10));
  if (coordinator->ListStages(&list_ctx, v1::Empty(), &stages).ok()) std::cout << StagesLines(stages);
  return reply.status() == grpc::health::v1::HealthCheckResponse::SERVING ? 0 : kExitFailure;
}


// CLI11's NonNegativeNumber says "Value -1 not in range 0.000000 to 1.79e308".
CLI::Validator NotNegative() {
  return CLI::Validator(
      [](std::string& value) {
        return !value.empty() && value[0] == '-' ? "must be 0 or more, got " + value : std::string();
      },
      "N >= 0");
}

// What the command line gives: each command's arguments and options, bound
// to CLI11 before the parse.
struct CliArgs {
  Common common;
  std::string file, job_id, device = "cpu", address, trace_prefix, profile_dir = ".";
  bool wait = false, reference = false;
  int stages = 0, threads = 0;
  std::string metrics_csv, curves_out, local_curves = "auto";
  std::string local_device = "auto";
  bool keep_logs = false;
  int64_t step = -1;
  double health_wait = 0;
  CheckpointExportOptions from_files;
};

// The commands, each set once the command line names it.
struct CliCommands {
  CLI::App *submit = nullptr, *status = nullptr, *list = nullptr, *cancel = nullptr, *resume = nullptr;
  CLI::App *train = nullptr, *local = nullptr, *trace = nullptr, *health = nullptr;
  CLI::App *export_cmd = nullptr, *keys = nullptr, *plot = nullptr;
};

void AddCliGlobalOptions(CLI::App& app, Common* common) {
  app.add_option("--coordinator", common->coordinator,
                 "coordinator HOST:PORT (default: $CONVEYOR_COORDINATOR, else 127.0.0.1:50050)");
  app.add_option("-v,--log-level", common->log_level, "trace, debug, info, warn, error, off")->capture_default_str();
  AddTlsFlags(app, &common->tls, "CONVEYOR_");
  app.add_option("--token-file", common->token_file,
                 "file holding the coordinator's token, for submit, cancel and resume (default: $CONVEYOR_TOKEN)");
}

// --set and --dry-run on every command that reads a job file.
void AddCliJobOverrides(CLI::App* cmd, Common* common) {
  cmd->add_option("--set", common->sets,
                  "KEY=VALUE: set a job key (dotted, as `conveyor keys` lists them) over the job file's; repeatable, "
                  "e.g. --set optimizer.lr=0.01 --set 'model.hidden=[64, 64]'");
  cmd->add_flag("--dry-run", common->dry_run, "print the effective job file (the file with --set applied) and run nothing");
}

// submit, status, list, cancel and resume: the coordinator's jobs.
void AddCliServerCommands(CLI::App& app, CliArgs* a, CliCommands* cmd) {
  cmd->submit = app.add_subcommand("submit", "submit a job file to the coordinator");
  cmd->submit->add_option("job", a->file, "job file (YAML)")->required();
  cmd->submit->add_flag("--wait", a->wait, "follow the job until it ends; exit 0 only if it succeeded");
  cmd->submit->add_flag("--json", a->common.json, "print the result as one JSON object on stdout");
  AddCliJobOverrides(cmd->submit, &a->common);

  cmd->status = app.add_subcommand("status", "show a job");
  cmd->status->add_option("job_id", a->job_id, "job id")->required();
  cmd->status->add_flag("--json", a->common.json, "print one JSON object");
  cmd->status->add_flag("--wait", a->wait, "follow the job until it ends; exit 0 only if it succeeded");
  cmd->status->add_option("--metrics-csv", a->metrics_csv,
                          "also write the job's curves to FILE: one row per training step and per evaluation");

  cmd->list = app.add_subcommand("list", "list the coordinator's jobs");
  cmd->list->add_flag("--json", a->common.json, "print a JSON array");

  cmd->cancel = app.add_subcommand("cancel", "cancel a queued or running job");
  cmd->cancel->add_option("job_id", a->job_id, "job id")->required();

  cmd->resume = app.add_subcommand(
      "resume", "queue a failed or cancelled job again: it goes on from its last checkpoint, optimizer state and step");
  cmd->resume->add_option("job_id", a->job_id, "job id")->required();
  cmd->resume->add_flag("--wait", a->wait, "follow the job until it ends; exit 0 only if it succeeded");
  cmd->resume->add_option("--set", a->common.sets,
                          "KEY=VALUE: lay the job out anew where it resumes (partition.stages, partition.boundaries, "
                          "schedule, ...; not what it trains): its checkpoint is loaded resharded; repeatable");
}

void AddCliTrainCommand(CLI::App& app, CliArgs* a, CliCommands* cmd) {
  CLI::App* train = cmd->train = app.add_subcommand("train", "train in this process: the correctness reference");
  train->add_option("job", a->file, "job file (YAML)")->required();
  train->add_flag("--reference", a->reference, "the whole model on one device, full batches, no pipeline");
  train->add_flag("--json", a->common.json, "print the result as one JSON object on stdout");
  train->add_option("--device", a->device, "cpu, cuda or cuda:N")
      ->check(CLI::Validator(
          [](std::string& d) {
            const bool ok = d == "cpu" || d == "cuda" ||
                            (d.rfind("cuda:", 0) == 0 && d.size() > 5 &&
                             d.find_first_not_of("0123456789", 5) == std::string::npos);
            return ok ? std::string() : "expected cpu, cuda or cuda:N, got '" + d + "'";
          },
          "DEVICE"))
      ->capture_default_str();
  train->add_option("--threads", a->threads,
                    "LibTorch intra-op threads (0: 1 on a CUDA device, LibTorch's default on the CPU)")
      ->check(NotNegative());
  train->add_option("--profile-dir", a->profile_dir, "where the job's profile_step writes its trace")
      ->capture_default_str();
  AddCliJobOverrides(train, &a->common);
}

void AddCliLocalCommand(CLI::App& app, CliArgs* a, CliCommands* cmd) {
  CLI::App* local = cmd->local = app.add_subcommand("local", "start a local cluster, run one job on it, stop it");
  local->add_option("job", a->file, "job file (YAML)")->required();
  local->add_option("--stages", a->stages, "stage servers to start (default: one per stage and replica; on GPUs at most one per GPU, stages folded together where they outnumber the GPUs)")
      ->check(NotNegative());
  local->add_option("--device", a->local_device, "auto (GPUs where present), cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  local->add_flag("--json", a->common.json, "print the result as one JSON object on stdout");
  local->add_flag("--keep-logs", a->keep_logs, "keep the cluster's logs and state even when the job succeeds");

  local->add_option("--trace", a->trace_prefix, "write the last step's timeline to PREFIX.json and PREFIX.png");
  local->add_option("--curves", a->local_curves,
                    "draw the job's training curves into this PNG at the end (default: beside save.path's weights as "
                    "NAME-curves.png, or NAME-curves-2.png and on where another run's is there; without save.path, "
                    "curves.png in the run's log folder, which keeps it; \"\" draws none)")
      ->capture_default_str();
  local->add_option("--profile-dir", a->profile_dir, "where each stage writes its trace of the job's profile_step")
      ->capture_default_str();
  AddCliJobOverrides(local, &a->common);
}

void AddCliTraceHealthCommands(CLI::App& app, CliArgs* a, CliCommands* cmd) {
  cmd->trace = app.add_subcommand("trace", "write a step's timeline: Chrome/Perfetto JSON and a PNG");
  cmd->trace->add_option("job_id", a->job_id, "job id")->required();
  cmd->trace->add_option("--step", a->step, "the step, from 1 as progress counts (default: the last one kept)");
  cmd->trace->add_option("--out", a->trace_prefix, "file prefix (default JOB-stepN)");

  cmd->health = app.add_subcommand("health", "probe a server with the standard gRPC health check");
  cmd->health->add_option("address", a->address, "HOST:PORT")->required();
  cmd->health->add_option("--wait", a->health_wait, "wait up to SECONDS for a server that is still starting")
      ->check(CLI::NonNegativeNumber);
}

// export, keys and plot: a job's weights, the job file's keys, a job's curves.
void AddCliExportCommands(CLI::App& app, CliArgs* a, CliCommands* cmd) {
  CheckpointExportOptions& from_files = a->from_files;
  CLI::App* export_cmd = cmd->export_cmd = app.add_subcommand(
      "export", "write a job's weights to a file on this host: fetched from the job's stage servers, or read from "
                "the checkpoint files of its stages (--checkpoint-dir) without a running cluster; a job that "
                "succeeded keeps its weights on the stages until the next job runs");
  export_cmd->add_option("job_id", a->job_id, "job id (with --checkpoint-dir: the job whose checkpoints to read, "
                                              "needed only when the folders hold several)");
  export_cmd->add_option("--out", from_files.out,
                         "the file to write: a state_dict (torch.load(FILE, weights_only=True)) or a TorchScript "
                         "archive (torch.jit.load(FILE))")
      ->required();
  export_cmd->add_option("--format", from_files.format,
                         "state_dict, or torchscript: the job's TorchScript archive with the trained weights (jobs "
                         "with model: {torchscript: PATH} only)")
      ->check(CLI::IsMember({"state_dict", "torchscript"}))
      ->capture_default_str();
  export_cmd->add_option("--checkpoint-dir", from_files.dirs,
                         "a stage server's --checkpoint-dir (repeat it: one per stage server); reads the weights "
                         "from the checkpoint files there instead of asking the stages");
  export_cmd->add_option("--step", from_files.step,
                         "with --checkpoint-dir: the checkpoint's step (default: the newest one every stage has)")
      ->check(CLI::PositiveNumber);

  cmd->keys = app.add_subcommand("keys", "print every job file key: type, default, meaning (docs/jobs.md's table)");

  cmd->plot = app.add_subcommand("plot", "draw a job's training curves into a PNG (loss, throughput, accuracy)");
  cmd->plot->add_option("job_id", a->job_id, "job id")->required();
  cmd->plot->add_option("--out", a->curves_out, "the PNG to write (default JOB-curves.png)");
}

// The rules between the parsed options that CLI11 cannot say: -1 where the
// command line holds, else the exit code of its usage error.
int CheckCliArguments(CLI::App& app, const CliCommands& cmd, CliArgs* a) {
  if (*cmd.health) {
    if (Status st = CheckAddress(a->address, "health"); !st.ok()) return UsageError(app, std::string(st.message()));
  } else if (*cmd.export_cmd && !a->from_files.dirs.empty()) {
    a->from_files.job_id = a->job_id;
  } else if (*cmd.export_cmd && (a->job_id.empty() || a->from_files.step != 0)) {
    return UsageError(app, a->job_id.empty() ? "export: give a job id, or --checkpoint-dir to read checkpoint files"
                                             : "export --step: only with --checkpoint-dir");
  } else if (*cmd.submit || *cmd.status || *cmd.list || *cmd.cancel || *cmd.resume || *cmd.trace || *cmd.export_cmd ||
             *cmd.plot) {
    const Common& common = a->common;
    if (Status st = CheckAddress(CoordinatorAddress(common), common.coordinator.empty() ? "$CONVEYOR_COORDINATOR"
                                                                                         : "--coordinator");
        !st.ok())
      return UsageError(app, std::string(st.message()));
  }
  if (*cmd.trace && a->step == 0) return UsageError(app, "trace --step: steps count from 1");
  if (*cmd.train && !a->reference)
    return UsageError(app, "train: `conveyor train` runs the single-process reference: add --reference (pipelines "
                           "run with `local` or `submit`)");
  // A --set that names no key, or one no job has, is the command line's
  // mistake whatever the job file holds: checked on an empty job.
  if (auto sets = ApplyJobOverrides("", a->common.sets); !sets.ok())
    return UsageError(app, std::string(sets.status().message()));
  return -1;
}

int RunCliCommand(const CliCommands& cmd, const CliArgs& a, const ReferenceTrainer& train_reference,
                  const CheckpointExporter& export_checkpoints) {
  const Common& common = a.common;
  if (*cmd.submit) return CmdSubmit(common, a.file, a.wait);
  if (*cmd.status) return CmdStatus(common, a.job_id, a.wait, a.metrics_csv);
  if (*cmd.plot) return CmdPlot(common, a.job_id, a.curves_out);
  if (*cmd.list) return CmdList(common);
  if (*cmd.cancel) return CmdCancel(common, a.job_id);
  if (*cmd.resume) return CmdResume(common, a.job_id, a.wait);
  if (*cmd.train) return CmdTrain(common, a.file, a.device, a.threads, a.profile_dir, train_reference);
  if (*cmd.local)
    return CmdLocal(common, a.file, a.stages, a.local_device, a.trace_prefix, a.profile_dir, a.keep_logs,
                    a.local_curves);
  if (*cmd.trace) return CmdTrace(common, a.job_id, a.step, a.trace_prefix);
  if (*cmd.health) return CmdHealth(a.address, a.health_wait);
  if (*cmd.export_cmd && !a.from_files.dirs.empty()) return CmdExportCheckpoints(a.from_files, export_checkpoints);
  if (*cmd.export_cmd) return CmdExport(common, a.job_id, a.from_files.out, a.from_files.format);
  return kExitUsage;
}

}  // namespace

int Main(int argc, char** argv, const ReferenceTrainer& train_reference,
         const CheckpointExporter& export_checkpoints) {
  CLI::App app{"conveyor: pipeline-parallel training as services"};
  app.name("conveyor");
  app.require_subcommand(1);
  app.fallthrough();  // the options below also after the command: `conveyor local JOB --tls-cert ...`
  CliArgs a;
  CliCommands cmd;
  AddCliGlobalOptions(app, &a.common);
  AddCliServerCommands(app, &a, &cmd);
  AddCliTrainCommand(app, &a, &cmd);
  AddCliLocalCommand(app, &a, &cmd);
  AddCliTraceHealthCommands(app, &a, &cmd);
  AddCliExportCommands(app, &a, &cmd);

  if (int rc = ParseCommandLine(app, argc, argv); rc >= 0) return rc;
  if (*cmd.keys) {
    std::fputs(JobKeysMarkdown().c_str(), stdout);
    return kExitOk;
  }
  if (int rc = CheckCliArguments(app, cmd, &a); rc >= 0) return rc;
  if (!ConfigureLogging(a.common.log_level, "conveyor")) return kExitUsage;
  if (!ConfigureTls(a.common.tls, "conveyor")) return kExitUsage;
  auto token = ResolveToken(a.common);
  if (!token.ok()) return UsageError(app, std::string(token.status().message()));
  BearerToken() = std::move(*token);
  return RunCliCommand(cmd, a, train_reference, export_checkpoints);
}

}  // namespace conveyor::cli
