// What the `conveyor` commands share (cli/commands.cpp, cli/local_command.cpp):
// their common flags, a job file read as the coordinator will read it, and the
// client side of a coordinator: its address and token, one call, a job
// submitted and followed to its end.
#pragma once

#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "common/net.h"
#include "common/security.h"
#include "common/status.h"
#include "conveyor.grpc.pb.h"
#include "plan/job_spec.h"

namespace conveyor::cli {

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

// Prints `st` as the CLI's error line; returns the exit code for it.
int Fail(const Status& st);
// An UNAVAILABLE call to `what` at `address`, said in words: who could not be
// reached and why ("connection refused", "host not found").
Status Unreachable(const Status& st, const std::string& what, const std::string& address);
// Where `conveyor train` and `conveyor local` find the files a job names:
// the job file's folder (relative paths are relative to it) and Debian's
// datasets.
std::vector<std::string> JobDataRoots(const std::string& job_file);
// A coordinator's refusal of a path (PERMISSION_DENIED or NOT_FOUND), with
// where that path leads from the job file's folder on this host.
Status WithLocalPathHint(const Status& st, const v1::JobSpec& spec, const std::string& file);
// The effective job of `file` as text and spec; with --dry-run it is printed
// instead, and `*printed` says so (the command then ends).
Status ReadJob(const Common& c, const std::string& file, std::string* yaml, v1::JobSpec* spec, bool* printed);
// The token every call to the coordinator carries (empty: none). Set once in
// Main() from --token-file or $CONVEYOR_TOKEN, before any call.
std::string& BearerToken();
// --token-file, else $CONVEYOR_TOKEN, else no token.
StatusOr<std::string> ResolveToken(const Common& c);
// --coordinator, else $CONVEYOR_COORDINATOR, else 127.0.0.1:50050.
std::string CoordinatorAddress(const Common& c);
// The coordinator this process talks to (set by Connect), for messages.
std::string& Target();
std::unique_ptr<v1::Coordinator::Stub> Connect(const std::string& address);

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
int Report(const v1::JobStatus& status, bool json);
// Follows a job until it ends, printing progress, then reports it. A
// coordinator that goes away meanwhile is waited for up to `reconnect_s`.
int WatchUntilDone(v1::Coordinator::Stub& stub, const std::string& job_id, bool json,
                   double reconnect_s = kDefaultRecoveryTimeoutS);
StatusOr<std::string> SubmitText(v1::Coordinator::Stub& stub, const std::string& yaml);
StatusOr<v1::Curves> FetchCurves(v1::Coordinator::Stub& stub, const std::string& job_id);
// Draws a job's curves into `png`; says what it wrote on `out`.
Status DrawCurves(v1::Coordinator::Stub& stub, const std::string& job_id, const std::string& png, std::ostream& out);
// Fetches one step's timeline (-1: the last) and writes PREFIX.json and
// PREFIX.png (default prefix: JOB-stepN); says what it wrote on `out`.
// Returns the exit code.
int WriteStepTrace(v1::Coordinator::Stub& stub, const std::string& job_id, int64_t step, std::string prefix,
                   std::ostream& out);

}  // namespace conveyor::cli
