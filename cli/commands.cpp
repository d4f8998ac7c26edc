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
#include "cli/curves.h"
#include "cli/export.h"
#include "cli/job_checks.h"
#include "cli/local_cluster.h"
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

int Fail(const Status& st) {
  std::cerr << "conveyor: error: " << st.message() << " (" << absl::StatusCodeToString(st.code()) << ")\n";
  return kExitFailure;
}

// An UNAVAILABLE call to `what` at `address`, said in words: who could not be
// reached and why ("connection refused", "host not found").
Status Unreachable(const Status& st, const std::string& what, const std::string& address) {
  if (st.code() != absl::StatusCode::kUnavailable) return st;
  return absl::UnavailableError("cannot reach " + what + " at " + address + ": " +
                                DescribeUnreachable(std::string(st.message())));
}

// Where `conveyor train` and `conveyor local` find the files a job names:
// the job file's folder (relative paths are relative to it) and Debian's
// datasets.
std::vector<std::string> JobDataRoots(const std::string& job_file) {
  const auto slash = job_file.rfind('/');
  std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : job_file.substr(0, slash);
  char real[PATH_MAX];
  if (::realpath(dir.c_str(), real) != nullptr) dir = real;
  return {dir, kDatasetsRoot};
}

struct Common {
  std::string coordinator;
  std::string log_level = "warn";
  bool json = false;
  TlsFiles tls;
  std::string token_file;
  // submit, local and train: --set KEY=VALUE overrides, and --dry-run (print
  // the effective job file, run nothing).
  std::vector<std::string> sets;
  bool dry_run = false;
};

// The job file with the command line's overrides applied (the effective job,
// what is sent and stored), checked here as the coordinator will check it: a
// binary file, a folder or a typo is named before anything is sent.
StatusOr<std::string> ReadCheckedJobFile(const Common& c, const std::string& path) {
  CONVEYOR_ASSIGN_OR_RETURN(std::string yaml, ReadJobFile(path));
  std::string where = path;
  if (!c.sets.empty()) {
    auto applied = ApplyJobOverrides(yaml, c.sets);
    if (!applied.ok()) return Annotate(applied.status(), path);
    yaml = std::move(*applied);
    where += " with --set";
    for (const std::string& s : c.sets) where += " " + s;
  }
  auto spec = ParseJobYaml(yaml);
  if (!spec.ok()) return Annotate(spec.status(), where);
  return yaml;
}

// The data roots a coordinator's refusal lists (ResolveJobPaths: "... the
// data roots: A, B)"); none when it lists none.
std::vector<std::string> RootsInRefusal(const std::string& message) {
  const std::string marker = "one of the data roots: ";
  const auto at = message.find(marker);
  if (at == std::string::npos) return {};
  const auto end = message.find(')', at);
  std::vector<std::string> roots;
  for (std::size_t from = at + marker.size(); from < end;) {
    const auto comma = std::min(message.find(", ", from), end);
    roots.push_back(message.substr(from, comma - from));
    from = comma + 2;
  }
  return roots;
}

bool UnderAny(const std::string& path, const std::vector<std::string>& roots) {
  for (const std::string& root : roots) {
    char real[PATH_MAX];
    const std::string r = ::realpath(root.c_str(), real) != nullptr ? real : root;
    if (r == "/" || path == r || (path.size() > r.size() && path.compare(0, r.size(), r) == 0 && path[r.size()] == '/'))
      return true;
  }
  return false;
}

// A coordinator's NOT_FOUND for a relative path of `spec` (it takes them
// under its first data root) says where that path leads from the job file's
// folder on this host when a file is there: what the user most likely meant,
// and how the coordinator gets to read it (a path outside its data roots is
// refused with PERMISSION_DENIED, so --set alone names it only inside them).
Status WithLocalPathHint(const Status& st, const v1::JobSpec& spec, const std::string& file) {
  if (!absl::IsNotFound(st)) return st;
  const std::string folder = JobDataRoots(file).front();
  const std::vector<std::string> roots = RootsInRefusal(std::string(st.message()));
  for (const auto& [key, path] : std::vector<std::pair<std::string, std::string>>{
           {"model.torchscript", spec.model().torchscript()}, {"model.exported", spec.model().exported()}, {"data.path", spec.data().path()},
           {"data.train", spec.data().train()}, {"data.test", spec.data().test()},
           {"loss.torchscript", spec.loss_torchscript()}, {"init_from", spec.init_from()}}) {
    if (path.empty() || path[0] == '/' || st.message().find(key + ": ") == std::string::npos) continue;
    const std::string local = folder + "/" + path;
    if (::access(local.c_str(), F_OK) != 0) continue;
    std::string hint = "; on this host it is " + local + ", next to the job file: ";
    if (UnderAny(local, roots)) {
      hint += "where the coordinator sees this host's files, --set " + key + "=" + local + " names it";
    } else {
      hint += "outside the coordinator's data roots, so it would refuse that path; copy the file under one of them, or "
              "start the coordinator with --data-root " + folder + " too (then --set " + key + "=" + local + " names it)";
    }
    return Status(st.code(), std::string(st.message()) + hint);
  }
  return st;
}

// The effective job of `file` as text and spec; with --dry-run it is printed
// instead, and `*printed` says so (the command then ends).
Status ReadJob(const Common& c, const std::string& file, std::string* yaml, v1::JobSpec* spec, bool* printed) {
  CONVEYOR_ASSIGN_OR_RETURN(*yaml, ReadCheckedJobFile(c, file));
  *printed = c.dry_run;
  if (c.dry_run) {
    std::cout << *yaml;
    return absl::OkStatus();
  }
  auto parsed = ParseJobYaml(*yaml);
  if (!parsed.ok()) return Annotate(parsed.status(), file);
  *spec = std::move(*parsed);
  return absl::OkStatus();
}

// The token every call to the coordinator carries (empty: none). Set once in
// Main() from --token-file or $CONVEYOR_TOKEN, before any call.
std::string& BearerToken() {
  static std::string token;
  return token;
}

// --token-file, else $CONVEYOR_TOKEN, else no token.
StatusOr<std::string> ResolveToken(const Common& c) {
  if (!c.token_file.empty()) return ReadTokenFile(c.token_file);
  const char* env = std::getenv("CONVEYOR_TOKEN");
  if (!env || !*env) return std::string();
  return ParseToken(env, "$CONVEYOR_TOKEN");
}

std::string CoordinatorAddress(const Common& c) {
  if (!c.coordinator.empty()) return c.coordinator;
  if (const char* env = std::getenv("CONVEYOR_COORDINATOR"); env && *env) return env;
  return "127.0.0.1:50050";
}

// The coordinator this process talks to (set by Connect), for messages.
std::string& Target() {
  static std::string target;
  return target;
}

std::unique_ptr<v1::Coordinator::Stub> Connect(const std::string& address) {
  Target() = address;
  return v1::Coordinator::NewStub(MakeChannel(address));
}

// One unary call to the coordinator, bounded by the CLI's deadline.
template <typename Req, typename Reply>
Status Call(v1::Coordinator::Stub& stub,
            grpc::Status (v1::Coordinator::Stub::*method)(grpc::ClientContext*, const Req&, Reply*),
            const Req& req, Reply* reply) {
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineAfter(30));
  AddBearerToken(&ctx, BearerToken());
  return Unreachable(FromGrpc((stub.*method)(&ctx, req, reply)), "the coordinator", Target());
}

// Prints the end of a job: the summary on stderr, and the JSON object on
// stdout with --json (the summary on stdout otherwise).
int Report(const v1::JobStatus& status, bool json) {
  if (json) {
    std::cerr << Summary(status);
    std::cout << ToJson(status).dump() << std::endl;
  } else {
    std::cout << Summary(status);
  }
  return status.state() == v1::JOB_STATE_SUCCEEDED ? 0 : kExitFailure;
}

// Whether a watch that broke off may be taken up again: the coordinator went
// away (restarted, its host rebooted), as opposed to refusing the watch.
bool CoordinatorWentAway(const grpc::Status& st) {
  switch (st.error_code()) {
    case grpc::StatusCode::OK:  // the stream ended without the job ending: a coordinator shutting down
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::CANCELLED:
    case grpc::StatusCode::UNKNOWN:
    case grpc::StatusCode::INTERNAL:  // a stream reset as the process died
      return true;
    default:
      return false;
  }
}

// GetJob once the coordinator answers again, waiting up to `wait_s` for it:
// a coordinator that is still stopping (it refuses calls while its jobs stop)
// is waited through as one that is not there yet.
Status GetJobWhenBack(v1::Coordinator::Stub& stub, const v1::GetJobRequest& req, v1::JobStatus* status,
                      double wait_s) {
  const auto deadline = DeadlineAfter(wait_s);
  for (;;) {
    grpc::ClientContext ctx;
    AddBearerToken(&ctx, BearerToken());
    ctx.set_wait_for_ready(true);
    ctx.set_deadline(deadline);
    grpc::Status st = stub.GetJob(&ctx, req, status);
    const bool stopping = st.error_code() == grpc::StatusCode::UNAVAILABLE || st.error_code() == grpc::StatusCode::CANCELLED;
    if (!stopping || std::chrono::system_clock::now() >= deadline) return FromGrpc(st);
  }
}

// Follows a job until it ends, printing progress, then reports it. A
// coordinator that goes away meanwhile (killed, or stopped in order) is
// waited for up to `reconnect_s` (the job's recovery_timeout: a restarted
// coordinator resumes its jobs), and the watch taken up again.
int WatchUntilDone(v1::Coordinator::Stub& stub, const std::string& job_id, bool json,
                   double reconnect_s = kDefaultRecoveryTimeoutS) {
  ProgressPrinter progress(true);
  v1::GetJobRequest req;
  req.set_job_id(job_id);
  req.set_omit_losses(true);
  v1::JobStatus status;
  for (bool again = false;; again = true) {
    if (again) {
      v1::JobStatus now;
      Status back = GetJobWhenBack(stub, req, &now, reconnect_s);
      if (!back.ok()) {
        progress.Finish();
        return Fail(Annotate(Unreachable(back, "the coordinator", Target()),
                             "watching " + job_id + " (the coordinator went away and did not answer again within " +
                                 FormatDuration(reconnect_s) + ")"));
      }
      std::cerr << "\nthe coordinator answers again; following " << job_id << std::endl;
    }
    grpc::ClientContext ctx;
    AddBearerToken(&ctx, BearerToken());
    auto reader = stub.WatchJob(&ctx, req);
    bool ended = false;
    while (reader->Read(&status)) {
      progress.Update(status);
      if (IsTerminal(status.state())) ended = true;
    }
    grpc::Status st = reader->Finish();
    if (ended) break;
    if (!CoordinatorWentAway(st)) {
      progress.Finish();
      return Fail(Annotate(Unreachable(FromGrpc(st), "the coordinator", Target()), "watching " + job_id));
    }
    std::cerr << "\nlost the coordinator (" << (st.ok() ? "its stream ended" : st.error_message())
              << "); waiting up to " << FormatDuration(reconnect_s) << " for it" << std::endl;
  }
  progress.Finish();
  req.set_omit_losses(false);
  Status got = Call(stub, &v1::Coordinator::Stub::GetJob, req, &status);
  if (got.code() == absl::StatusCode::kUnavailable || got.code() == absl::StatusCode::kCancelled) {
    // The job ended and the coordinator went away before its last answer:
    // the next one has the job's end (its store saved it).
    got = Unreachable(GetJobWhenBack(stub, req, &status, reconnect_s), "the coordinator", Target());
  }
  if (!got.ok()) return Fail(got);
  return Report(status, json);
}

StatusOr<std::string> SubmitText(v1::Coordinator::Stub& stub, const std::string& yaml) {
  v1::SubmitJobRequest req;
  req.set_job_yaml(yaml);
  v1::SubmitJobReply reply;
  CONVEYOR_RETURN_IF_ERROR(Call(stub, &v1::Coordinator::Stub::SubmitJob, req, &reply));
  return reply.job_id();
}

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

StatusOr<v1::Curves> FetchCurves(v1::Coordinator::Stub& stub, const std::string& job_id) {
  v1::GetCurvesRequest req;
  req.set_job_id(job_id);
  v1::Curves curves;
  CONVEYOR_RETURN_IF_ERROR(Call(stub, &v1::Coordinator::Stub::GetCurves, req, &curves));
  return curves;
}

// Draws a job's curves into `png`; says what it wrote on `out`.
Status DrawCurves(v1::Coordinator::Stub& stub, const std::string& job_id, const std::string& png, std::ostream& out) {
  CONVEYOR_ASSIGN_OR_RETURN(v1::Curves curves, FetchCurves(stub, job_id));
  CONVEYOR_RETURN_IF_ERROR(PlotCurves(curves, png));
  out << "wrote " << png << ": the curves of " << job_id << " (" << Plural(curves.steps_size(), "step") << ", "
      << Plural(curves.evals_size(), "evaluation") << ")\n";
  return absl::OkStatus();
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

// Fetches one step's timeline and writes PREFIX.json and PREFIX.png.
int WriteStepTrace(v1::Coordinator::Stub& stub, const std::string& job_id, int64_t step, std::string prefix,
                   std::ostream& out) {
  v1::GetJobRequest get;
  get.set_job_id(job_id);
  get.set_omit_losses(true);
  v1::JobStatus status;
  Status st = Call(stub, &v1::Coordinator::Stub::GetJob, get, &status);
  if (!st.ok()) return Fail(st);
  v1::GetTraceRequest req;
  req.set_job_id(job_id);
  req.set_step(step);
  v1::StepTrace trace;
  st = Call(stub, &v1::Coordinator::Stub::GetTrace, req, &trace);
  if (!st.ok()) return Fail(st);
  if (prefix.empty()) prefix = job_id + "-step" + std::to_string(trace.step());
  auto said = WriteTrace(trace, status.theoretical_idle_fraction(), prefix);
  if (!said.ok()) return Fail(said.status());
  out << *said << "\n";
  return 0;
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

// Ctrl-C, SIGTERM or SIGHUP (the terminal closed) during `local`: cancel the
// job, and let the normal path tear the cluster down. A second signal gives up
// waiting.
class InterruptWatcher {
 public:
  InterruptWatcher() : thread_([this] { Loop(); }) {}
  ~InterruptWatcher() {
    done_ = true;
    thread_.join();
  }
  void SetJob(v1::Coordinator::Stub* stub, const std::string& job_id) {
    std::lock_guard<std::mutex> lock(mu_);
    stub_ = stub;
    job_id_ = job_id;
  }
  bool interrupted() const { return signals_ > 0; }
  // Blocks until the first signal has come (and the job, if any, was cancelled).
  void WaitForSignal() {
    std::unique_lock<std::mutex> lock(mu_);
    signalled_.wait(lock, [this] { return signals_ > 0; });
  }
  // The shell's exit status for the first signal: 128 + its number.
  int exit_code() const { return 128 + first_.load(); }

 private:
  void Loop() {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    timespec tick{0, 200 * 1000 * 1000};
    while (!done_) {
      const int sig = sigtimedwait(&set, nullptr, &tick);
      if (sig < 0) continue;  // timeout: look at done_ again
      if (++signals_ > 1) {
        std::cerr << "\nconveyor: interrupted again: stopping the cluster now\n";
        std::_Exit(exit_code());  // children get SIGTERM through PR_SET_PDEATHSIG
      }
      first_ = sig;
      std::cerr << "\nconveyor: interrupted: cancelling the job and stopping the cluster\n";
      std::lock_guard<std::mutex> lock(mu_);
      if (stub_) {
        v1::JobRef req;
        req.set_job_id(job_id_);
        v1::JobStatus status;
        grpc::ClientContext ctx;
        ctx.set_deadline(DeadlineAfter(10));
        AddBearerToken(&ctx, BearerToken());
        stub_->CancelJob(&ctx, req, &status);
      }
      signalled_.notify_all();
    }
  }

  std::atomic<bool> done_{false};
  std::atomic<int> signals_{0};
  std::atomic<int> first_{SIGINT};
  std::mutex mu_;  // guards stub_ and job_id_; signalled_ waits under it
  std::condition_variable signalled_;
  v1::Coordinator::Stub* stub_ = nullptr;
  std::string job_id_;
  std::thread thread_;
};

// `conveyor local` on GPUs: a job whose stages outnumber the GPUs runs folded
// (FoldOntoGpus), `yaml` and `spec` becoming the folded job; says what it did,
// or why the stages share GPUs.
Status FoldOntoHost(const std::string& file, int gpus, std::string* yaml, v1::JobSpec* spec) {
  const GpuFold fold = FoldOntoGpus(*spec, gpus);
  if (!fold.why_not.empty()) {
    std::cerr << "note: " << fold.why_not << "; processes that share a GPU take turns on it" << std::endl;
  }
  if (fold.sets.empty()) return absl::OkStatus();
  CONVEYOR_ASSIGN_OR_RETURN(std::string folded, ApplyJobOverrides(*yaml, fold.sets));
  auto parsed = ParseJobYaml(folded);
  if (!parsed.ok()) return Annotate(parsed.status(), file + " folded onto " + std::to_string(gpus) + " GPUs");
  std::cerr << "this host has " << gpus << " GPU(s) for the job's " << fold.stages << " stages: running them as "
            << fold.folded << ", one stage server per GPU, each holding " << (fold.stages % fold.folded ? "about " : "")
            << fold.stages / fold.folded << " of them (the same losses and weights; two processes on one GPU take "
            << "turns on it; --stages " << fold.stages * Replicas(*spec) << " starts one server per stage)" << std::endl;
  *yaml = std::move(folded);
  *spec = std::move(*parsed);
  return absl::OkStatus();
}

// A pipeline of GPU stages runs with one hardware queue per device
// (CUDA_DEVICE_MAX_CONNECTIONS=1 in the stage servers' environment, which
// they inherit) unless the environment already says: W1 over two NCCL-linked
// H100s hung at the first replayed step in about half the runs otherwise, and
// took 19.5 ms a step against 25 (docs/architecture.md, bench/RESULTS.md).
void UseOneHardwareQueue(const v1::JobSpec& spec, int gpus) {
  if (gpus == 0 || spec.partition().stages() < 2 || std::getenv("CUDA_DEVICE_MAX_CONNECTIONS") != nullptr) return;
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1", 1);
  std::cerr << "stage servers start with CUDA_DEVICE_MAX_CONNECTIONS=1 (one hardware queue per GPU, for a pipeline "
               "over NCCL links; set it to keep your own)"
            << std::endl;
}

// One job on a local cluster, from its submission to the cluster's end.
struct LocalRun {
  LocalCluster& cluster;
  InterruptWatcher& interrupts;
  const v1::JobSpec& spec;
  bool json = false;
  bool keep_logs = false;
  std::string job_id;        // empty: no job was submitted
  std::string curves;        // the picture drawn in the run's folder, if any
  std::string weights;       // the weights rescued into the run's folder, if any
  int rc = kExitFailure;
};

// A job that trained but could not write save.path: its stages keep the
// weights until the cluster stops, so this process writes them into the
// run's folder, and says where. If that fails too, the cluster stays up for
// `conveyor export` until a signal.
void RescueWeights(v1::Coordinator::Stub& stub, LocalRun* run) {
  v1::GetJobRequest req;
  req.set_job_id(run->job_id);
  req.set_omit_losses(true);
  v1::JobStatus status;
  if (!Call(stub, &v1::Coordinator::Stub::GetJob, req, &status).ok() || !WeightsKept(status)) return;
  const std::string path = RescuedWeightsPath(run->spec.save_path(), run->cluster.run_dir());
  const std::string format = run->spec.save_format() == v1::SAVE_FORMAT_TORCHSCRIPT ? "torchscript" : "state_dict";
  auto wrote = ExportWeights(status, path, format);
  if (wrote.ok()) {
    run->weights = path;
    std::cerr << "the trained weights are in " << path << " (" << FormatBytes(wrote->bytes)
              << "): save.path " << run->spec.save_path() << " could not take them; move them where there is room"
              << std::endl;
    return;
  }
  std::cerr << "cannot write the trained weights into " << path << " either: " << wrote.status().message()
            << "\nthe cluster keeps them: from another shell, `conveyor --coordinator "
            << run->cluster.coordinator_address() << " export " << run->job_id
            << " --out FILE` writes them where there is room; Ctrl-C stops the cluster" << std::endl;
  run->interrupts.WaitForSignal();
}

// Submits `yaml`, follows the job, and writes what it leaves: the rescued
// weights, the trace, the curves. Returns the exit code.
int RunLocalJob(const std::string& file, const std::string& yaml, const std::string& trace_prefix,
                const std::string& curves, LocalRun* run) {
  if (run->interrupts.interrupted()) return run->interrupts.exit_code();
  auto stub = Connect(run->cluster.coordinator_address());
  auto id = SubmitText(*stub, yaml);
  if (!id.ok()) return Fail(Annotate(id.status(), file));
  run->job_id = *id;
  run->interrupts.SetJob(stub.get(), *id);
  std::cerr << "submitted " << *id << std::endl;
  int rc = WatchUntilDone(*stub, *id, run->json);
  run->interrupts.SetJob(nullptr, "");
  if (rc != 0 && !run->spec.save_path().empty() && !run->interrupts.interrupted()) RescueWeights(*stub, run);
  if (rc == 0 && !trace_prefix.empty()) rc = WriteStepTrace(*stub, *id, -1, trace_prefix, std::cerr);
  if (curves.empty() || run->interrupts.interrupted()) return rc;
  std::string png = curves;
  if (png == "auto") {  // a name no other run has: beside the weights, or in this run's folder
    auto reserved = ReserveCurvesPicture(run->spec.save_path(), run->cluster.run_dir());
    if (!reserved.ok()) {
      std::cerr << "no curves: " << reserved.status().message() << "\n";
      return rc;
    }
    png = *reserved;
  }
  Status drawn = DrawCurves(*stub, *id, png, std::cerr);
  if (!drawn.ok()) {
    std::cerr << "no curves: " << drawn.message() << "\n";
    if (curves == "auto") ::unlink(png.c_str());  // the empty file reserved above
  } else if (png.rfind(run->cluster.run_dir() + "/", 0) == 0) {
    run->curves = png;
  }
  return rc;
}

// Stops the cluster and says what stays of the run: its folder is removed
// for a job that never started, and for one that succeeded (but for its
// curves picture, and unless --keep-logs); otherwise it says where it is.
int EndLocalRun(LocalRun* run) {
  run->cluster.Stop();
  const std::string& dir = run->cluster.run_dir();
  if (run->job_id.empty()) {
    RemoveTree(dir);  // nothing ran: its logs say only that the servers started
  } else if (run->rc == 0 && !run->keep_logs) {
    for (const std::string& name : ListDir(dir)) {  // RemoveTree: std::filesystem's walks crash under a wheel's LibTorch
      if (dir + "/" + name != run->curves) RemoveTree(dir + "/" + name);
    }
    if (run->curves.empty()) {
      RemoveTree(dir);
      std::cerr << "removed " << dir << " (logs of a job that succeeded; --keep-logs keeps them)\n";
    } else {
      std::cerr << "removed the logs in " << dir << " (a job that succeeded; --keep-logs keeps them); its curves stay in "
                << run->curves << "\n";
    }
  } else {
    std::cerr << "logs kept in " << dir << (run->weights.empty() ? "" : ", with the trained weights") << "\n";
  }
  return run->interrupts.interrupted() ? run->interrupts.exit_code() : run->rc;
}

int CmdLocal(const Common& c, const std::string& file, int stages, const std::string& device,
             const std::string& trace_prefix, const std::string& profile_dir, bool keep_logs, std::string curves) {
  std::string yaml;
  v1::JobSpec job;
  bool printed = false;
  if (Status st = ReadJob(c, file, &yaml, &job, &printed); !st.ok()) return Fail(st);
  if (printed) return 0;
  v1::JobSpec* spec = &job;
  LocalClusterOptions options;
  options.bin_dir = ExecutableDir();
  const int gpus = device == "cpu" ? 0 : CountGpus(options.bin_dir);
  if (device == "cuda" && gpus == 0) return Fail(absl::FailedPreconditionError("--device cuda: no CUDA device here"));
  if (stages == 0) {  // one stage server per GPU (plan/placement.h); --stages N starts N
    if (Status folded = FoldOntoHost(file, gpus, &yaml, spec); !folded.ok()) return Fail(folded);
  }
  UseOneHardwareQueue(*spec, gpus);
  options.data_roots = JobDataRoots(file);
  if (Status files = ResolveJobPaths(spec, options.data_roots); !files.ok()) return Fail(Annotate(files, file));
  // What would fail the job at once fails it before any server starts.
  if (Status checked = CheckJobBeforeStart(*spec); !checked.ok()) return Fail(Annotate(checked, file));
  options.stages = stages > 0 ? stages : Replicas(*spec) * std::max(1, spec->partition().stages());
  options.log_level = c.log_level == "warn" ? "info" : c.log_level;
  for (int i = 0; i < options.stages; ++i)
    options.devices.push_back(gpus > 0 ? "cuda:" + std::to_string(i % gpus) : "cpu");
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // GPU stages take their own default (model/device.h: one thread on CUDA).
  options.threads_per_stage = gpus > 0 ? 0 : std::max(1, cores / options.stages);
  // CPU stages share the host's cores with each other, the coordinator and
  // their own gRPC and link threads; LibTorch's OpenMP workers spin after
  // every operation before they sleep (libgomp: 300000 spins), on cores the
  // others need: a one-stage toy job on 2 cores spent 40% of its CPU time so.
  // Sleeping at once (OMP_WAIT_POLICY=PASSIVE) halved the toy's step but made
  // a one-stage ConvNet 2.3x slower; 30000 spins gave the toy 21% and the
  // ConvNet nothing either way (2-core CPU machine, 2026-11-26, bench/RESULTS.md). A stage of
  // one thread has no OpenMP workers.
  std::string omp;
  if (gpus == 0 && options.threads_per_stage > 1 && std::getenv("OMP_WAIT_POLICY") == nullptr &&
      std::getenv("GOMP_SPINCOUNT") == nullptr) {
    options.stage_env.push_back("GOMP_SPINCOUNT=30000");
    omp = "; OpenMP workers spin 30000 times between operations: GOMP_SPINCOUNT, set it or OMP_WAIT_POLICY to "
          "keep your own";
  }
  options.tls = c.tls;
  options.auth_token = BearerToken();
  if (spec->profile_step() > 0) options.profile_dir = std::filesystem::absolute(profile_dir).string();

  BlockTerminationSignals();
  InterruptWatcher interrupts;
  std::cerr << "starting " << options.stages << " stage server(s) on " << (gpus > 0 ? "GPUs" : "CPU") << " ("
            << (options.threads_per_stage > 0 ? options.threads_per_stage : 1) << " thread(s) each" << omp
            << ") and a coordinator" << std::endl;
  auto cluster = LocalCluster::Start(options);
  if (!cluster.ok()) return Fail(cluster.status());
  std::cerr << "cluster up: coordinator " << (*cluster)->coordinator_address() << ", logs in "
            << (*cluster)->run_dir() << std::endl;
  LocalRun run{**cluster, interrupts, *spec, c.json, keep_logs};
  run.rc = RunLocalJob(file, yaml, trace_prefix, curves, &run);
  return EndLocalRun(&run);
}

// CLI11's NonNegativeNumber says "Value -1 not in range 0.000000 to 1.79e308".
CLI::Validator NotNegative() {
  return CLI::Validator(
      [](std::string& value) {
        return !value.empty() && value[0] == '-' ? "must be 0 or more, got " + value : std::string();
      },
      "N >= 0");
}

}  // namespace

int Main(int argc, char** argv, const ReferenceTrainer& train_reference,
         const CheckpointExporter& export_checkpoints) {
  CLI::App app{"conveyor: pipeline-parallel training as services"};
  app.name("conveyor");
  app.require_subcommand(1);
  app.fallthrough();  // the options below also after the command: `conveyor local JOB --tls-cert ...`
  Common common;
  app.add_option("--coordinator", common.coordinator,
                 "coordinator HOST:PORT (default: $CONVEYOR_COORDINATOR, else 127.0.0.1:50050)");
  app.add_option("-v,--log-level", common.log_level, "trace, debug, info, warn, error, off")->capture_default_str();
  AddTlsFlags(app, &common.tls, "CONVEYOR_");
  app.add_option("--token-file", common.token_file,
                 "file holding the coordinator's token, for submit, cancel and resume (default: $CONVEYOR_TOKEN)");

  std::string file, job_id, device = "cpu", address, trace_prefix, profile_dir = ".";
  bool wait = false, reference = false;
  int stages = 0, threads = 0;

  auto* submit = app.add_subcommand("submit", "submit a job file to the coordinator");
  submit->add_option("job", file, "job file (YAML)")->required();
  submit->add_flag("--wait", wait, "follow the job until it ends; exit 0 only if it succeeded");
  submit->add_flag("--json", common.json, "print the result as one JSON object on stdout");
  // --set and --dry-run on every command that reads a job file.
  auto add_overrides = [&common](CLI::App* cmd) {
    cmd->add_option("--set", common.sets,
                    "KEY=VALUE: set a job key (dotted, as `conveyor keys` lists them) over the job file's; repeatable, "
                    "e.g. --set optimizer.lr=0.01 --set 'model.hidden=[64, 64]'");
    cmd->add_flag("--dry-run", common.dry_run, "print the effective job file (the file with --set applied) and run nothing");
  };
  add_overrides(submit);

  auto* status = app.add_subcommand("status", "show a job");
  status->add_option("job_id", job_id, "job id")->required();
  status->add_flag("--json", common.json, "print one JSON object");
  status->add_flag("--wait", wait, "follow the job until it ends; exit 0 only if it succeeded");
  std::string metrics_csv, curves_out, local_curves = "auto";
  status->add_option("--metrics-csv", metrics_csv,
                     "also write the job's curves to FILE: one row per training step and per evaluation");


  auto* list = app.add_subcommand("list", "list the coordinator's jobs");
  list->add_flag("--json", common.json, "print a JSON array");

  auto* cancel = app.add_subcommand("cancel", "cancel a queued or running job");
  cancel->add_option("job_id", job_id, "job id")->required();

  auto* resume = app.add_subcommand(
      "resume", "queue a failed or cancelled job again: it goes on from its last checkpoint, optimizer state and step");
  resume->add_option("job_id", job_id, "job id")->required();
  resume->add_flag("--wait", wait, "follow the job until it ends; exit 0 only if it succeeded");
  resume->add_option("--set", common.sets,
                     "KEY=VALUE: lay the job out anew where it resumes (partition.stages, partition.boundaries, "
                     "schedule, ...; not what it trains): its checkpoint is loaded resharded; repeatable");

  auto* train = app.add_subcommand("train", "train in this process: the correctness reference");
  train->add_option("job", file, "job file (YAML)")->required();
  train->add_flag("--reference", reference, "the whole model on one device, full batches, no pipeline");
  train->add_flag("--json", common.json, "print the result as one JSON object on stdout");
  train->add_option("--device", device, "cpu, cuda or cuda:N")
      ->check(CLI::Validator(
          [](std::string& d) {
            const bool ok = d == "cpu" || d == "cuda" ||
                            (d.rfind("cuda:", 0) == 0 && d.size() > 5 &&
                             d.find_first_not_of("0123456789", 5) == std::string::npos);
            return ok ? std::string() : "expected cpu, cuda or cuda:N, got '" + d + "'";
          },
          "DEVICE"))
      ->capture_default_str();
  train->add_option("--threads", threads, "LibTorch intra-op threads (0: 1 on a CUDA device, LibTorch's default on the CPU)")
      ->check(NotNegative());
  train->add_option("--profile-dir", profile_dir, "where the job's profile_step writes its trace")->capture_default_str();
  add_overrides(train);

  std::string local_device = "auto";
  auto* local = app.add_subcommand("local", "start a local cluster, run one job on it, stop it");
  local->add_option("job", file, "job file (YAML)")->required();
  local->add_option("--stages", stages, "stage servers to start (default: one per stage and replica; on GPUs at most one per GPU, stages folded together where they outnumber the GPUs)")
      ->check(NotNegative());
  local->add_option("--device", local_device, "auto (GPUs where present), cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  local->add_flag("--json", common.json, "print the result as one JSON object on stdout");
  bool keep_logs = false;
  local->add_flag("--keep-logs", keep_logs, "keep the cluster's logs and state even when the job succeeds");

  local->add_option("--trace", trace_prefix, "write the last step's timeline to PREFIX.json and PREFIX.png");
  local->add_option("--curves", local_curves,
                    "draw the job's training curves into this PNG at the end (default: beside save.path's weights as "
                    "NAME-curves.png, or NAME-curves-2.png and on where another run's is there; without save.path, "
                    "curves.png in the run's log folder, which keeps it; \"\" draws none)")
      ->capture_default_str();
  local->add_option("--profile-dir", profile_dir, "where each stage writes its trace of the job's profile_step")
      ->capture_default_str();
  add_overrides(local);

  int64_t step = -1;
  auto* trace = app.add_subcommand("trace", "write a step's timeline: Chrome/Perfetto JSON and a PNG");
  trace->add_option("job_id", job_id, "job id")->required();
  trace->add_option("--step", step, "the step, from 1 as progress counts (default: the last one kept)");
  trace->add_option("--out", trace_prefix, "file prefix (default JOB-stepN)");

  auto* health = app.add_subcommand("health", "probe a server with the standard gRPC health check");
  health->add_option("address", address, "HOST:PORT")->required();
  double health_wait = 0;
  health->add_option("--wait", health_wait, "wait up to SECONDS for a server that is still starting")
      ->check(CLI::NonNegativeNumber);

  CheckpointExportOptions from_files;
  auto* export_cmd = app.add_subcommand(
      "export", "write a job's weights to a file on this host: fetched from the job's stage servers, or read from "
                "the checkpoint files of its stages (--checkpoint-dir) without a running cluster; a job that "
                "succeeded keeps its weights on the stages until the next job runs");
  export_cmd->add_option("job_id", job_id, "job id (with --checkpoint-dir: the job whose checkpoints to read, "
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

  auto* keys = app.add_subcommand("keys", "print every job file key: type, default, meaning (docs/jobs.md's table)");

  auto* plot = app.add_subcommand("plot", "draw a job's training curves into a PNG (loss, throughput, accuracy)");
  plot->add_option("job_id", job_id, "job id")->required();
  plot->add_option("--out", curves_out, "the PNG to write (default JOB-curves.png)");

  if (int rc = ParseCommandLine(app, argc, argv); rc >= 0) return rc;
  if (*keys) {
    std::fputs(JobKeysMarkdown().c_str(), stdout);
    return kExitOk;
  }
  if (*health) {
    if (Status st = CheckAddress(address, "health"); !st.ok()) return UsageError(app, std::string(st.message()));
  } else if (*export_cmd && !from_files.dirs.empty()) {
    from_files.job_id = job_id;
  } else if (*export_cmd && (job_id.empty() || from_files.step != 0)) {
    return UsageError(app, job_id.empty() ? "export: give a job id, or --checkpoint-dir to read checkpoint files"
                                          : "export --step: only with --checkpoint-dir");
  } else if (*submit || *status || *list || *cancel || *resume || *trace || *export_cmd || *plot) {
    if (Status st = CheckAddress(CoordinatorAddress(common), common.coordinator.empty() ? "$CONVEYOR_COORDINATOR"
                                                                                         : "--coordinator");
        !st.ok())
      return UsageError(app, std::string(st.message()));
  }
  if (*trace && step == 0) return UsageError(app, "trace --step: steps count from 1");
  if (*train && !reference)
    return UsageError(app, "train: `conveyor train` runs the single-process reference: add --reference (pipelines "
                           "run with `local` or `submit`)");
  // A --set that names no key, or one no job has, is the command line's
  // mistake whatever the job file holds: checked on an empty job.
  if (auto sets = ApplyJobOverrides("", common.sets); !sets.ok()) return UsageError(app, std::string(sets.status().message()));
  if (!ConfigureLogging(common.log_level, "conveyor")) return kExitUsage;
  if (!ConfigureTls(common.tls, "conveyor")) return kExitUsage;
  auto token = ResolveToken(common);
  if (!token.ok()) return UsageError(app, std::string(token.status().message()));
  BearerToken() = std::move(*token);

  if (*submit) return CmdSubmit(common, file, wait);
  if (*status) return CmdStatus(common, job_id, wait, metrics_csv);
  if (*plot) return CmdPlot(common, job_id, curves_out);
  if (*list) return CmdList(common);
  if (*cancel) return CmdCancel(common, job_id);
  if (*resume) return CmdResume(common, job_id, wait);
  if (*train) return CmdTrain(common, file, device, threads, profile_dir, train_reference);
  if (*local) return CmdLocal(common, file, stages, local_device, trace_prefix, profile_dir, keep_logs, local_curves);
  if (*trace) return CmdTrace(common, job_id, step, trace_prefix);
  if (*health) return CmdHealth(address, health_wait);
  if (*export_cmd && !from_files.dirs.empty()) return CmdExportCheckpoints(from_files, export_checkpoints);
  if (*export_cmd) return CmdExport(common, job_id, from_files.out, from_files.format);
  return kExitUsage;
}

}  // namespace conveyor::cli
