#include "cli/client.h"

#include <limits.h>
#include <stdlib.h>

#include <cstdlib>
#include <iostream>

#include "cli/curves.h"
#include "cli/output.h"
#include "cli/trace.h"
#include "common/command_line.h"
#include "common/files.h"
#include "plan/job_overrides.h"

namespace conveyor::cli {
namespace {

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

}  // namespace

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


// Follows a job until it ends, printing progress, then reports it. A
// coordinator that goes away meanwhile (killed, or stopped in order) is
// waited for up to `reconnect_s` (the job's recovery_timeout: a restarted
// coordinator resumes its jobs), and the watch taken up again.
int WatchUntilDone(v1::Coordinator::Stub& stub, const std::string& job_id, bool json, double reconnect_s) {
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

}  // namespace conveyor::cli
