#include "common/server.h"

#include <execinfo.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <netdb.h>
#include <sys/socket.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <grpc/support/log.h>
#include <grpcpp/server_builder.h>

#include <csignal>

#include "common/files.h"
#include "common/logging.h"
#include "common/net.h"
#include "common/security.h"
#include "health.grpc.pb.h"

namespace conveyor {

namespace {

// gRPC says only that it could not bind; a plain bind() of the same address
// says why (EADDRINUSE, EADDRNOTAVAIL, EACCES).
std::string WhyCannotBind(const std::string& listen) {
  const auto colon = listen.rfind(':');
  std::string host = listen.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  if (host == "localhost") host = "127.0.0.1";
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port = listen.substr(colon + 1);
  if (getaddrinfo(host == "0.0.0.0" || host == "*" ? nullptr : host.c_str(), port.c_str(), &hints, &found) != 0)
    return "host '" + host + "' not found";
  std::string why = "gRPC could not bind it";
  for (addrinfo* a = found; a; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0) {
      why = errno == EADDRINUSE      ? "address already in use (another server listens on that port)"
            : errno == EADDRNOTAVAIL ? "that is not an address of this host"
            : errno == EACCES        ? "permission denied (ports below 1024 need privileges)"
                                     : std::strerror(errno);
      close(fd);
      break;
    }
    close(fd);
  }
  freeaddrinfo(found);
  return why;
}

// gRPC logs a failed bind itself, as a raw error dump (chttp2_server.cc,
// server_builder.cc) before Start's own message says the same in words. While
// a server starts, those files' lines go unprinted unless GRPC_VERBOSITY asks
// for gRPC's log; every other line is printed as gRPC's default log prints it.
std::atomic<int> starting{0};

void QuietWhileStarting(gpr_log_func_args* args) {
  const std::string file = args->file ? args->file : "";
  if (starting.load() > 0) {
    for (const std::string quiet : {"chttp2_server.cc", "server_builder.cc", "tcp_server_utils_posix_common.cc"})
      if (file.size() >= quiet.size() && file.compare(file.size() - quiet.size(), std::string::npos, quiet) == 0)
        return;
  }
  const auto slash = file.rfind('/');
  std::fprintf(stderr, "%s %s:%d] %s\n", gpr_log_severity_string(args->severity),
               slash == std::string::npos ? file.c_str() : file.c_str() + slash + 1, args->line, args->message);
}

// Counts a start in progress for QuietWhileStarting, installed once
// (gRPC's log function is process-wide).
class QuietBind {
 public:
  QuietBind() {
    static const bool installed = [] {
      if (std::getenv("GRPC_VERBOSITY") == nullptr) gpr_set_log_function(QuietWhileStarting);
      return true;
    }();
    (void)installed;
    ++starting;
  }
  ~QuietBind() { --starting; }
  QuietBind(const QuietBind&) = delete;
  QuietBind& operator=(const QuietBind&) = delete;
};

}  // namespace

// The standard health check (grpc.health.v1), served synchronously. gRPC's
// own default service answers with its callback API, and a server with a
// callback method runs gRPC's callback queue, whose threads sleep 100 ms
// after each idle second (transport/grpc/stage_data_service.h says what that
// cost a stage server's steps). As gRPC's own: SERVING for "" (the server as
// a whole), NOT_SERVING once it shuts down, NOT_FOUND for a name. Watch is
// not served (UNIMPLEMENTED, which gRPC's own clients read as "no health
// checking").
class GrpcServer::Health final : public grpc::health::v1::Health::Service {
 public:
  void Stop() { serving_ = false; }

  grpc::Status Check(grpc::ServerContext*, const grpc::health::v1::HealthCheckRequest* req,
                     grpc::health::v1::HealthCheckResponse* reply) override {
    if (!req->service().empty())
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown service '" + req->service() + "' (ask for \"\")");
    reply->set_status(serving_ ? grpc::health::v1::HealthCheckResponse::SERVING
                               : grpc::health::v1::HealthCheckResponse::NOT_SERVING);
    return grpc::Status::OK;
  }

 private:
  std::atomic<bool> serving_{true};
};

StatusOr<std::unique_ptr<GrpcServer>> GrpcServer::Start(const std::string& listen,
                                                        const std::vector<grpc::Service*>& services,
                                                        const std::string& port_file) {
  CONVEYOR_RETURN_IF_ERROR(CheckAddress(listen, "--listen", /*listen=*/true));
  const auto colon = listen.rfind(':');
  grpc::EnableDefaultHealthCheckService(false);  // Health below instead
  grpc::ServerBuilder builder;
  std::unique_ptr<GrpcServer> server(new GrpcServer());
  builder.AddListeningPort(listen, ServerCredentials(ProcessTls()), &server->port_);
  // gRPC sets SO_REUSEPORT by default on Linux: a second server on the same
  // port would start and share it with the first, and calls would alternate
  // between the two. One port, one server.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(-1);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  server->health_ = std::make_unique<Health>();
  builder.RegisterService(server->health_.get());
  for (grpc::Service* s : services) builder.RegisterService(s);
  {
    QuietBind quiet;
    server->server_ = builder.BuildAndStart();
  }
  if (!server->server_ || server->port_ == 0)
    return absl::UnavailableError("cannot listen on " + listen + ": " + WhyCannotBind(listen));
  server->address_ = listen.substr(0, colon) + ":" + std::to_string(server->port_);
  if (!port_file.empty()) CONVEYOR_RETURN_IF_ERROR(WriteFileAtomically(port_file, server->address_ + "\n"));
  return server;
}

GrpcServer::GrpcServer() = default;
GrpcServer::~GrpcServer() { Shutdown(); }

void GrpcServer::Shutdown(double grace_seconds) {
  if (shut_down_ || !server_) return;
  shut_down_ = true;
  health_->Stop();
  server_->Shutdown(DeadlineAfter(grace_seconds));
  server_->Wait();
}

namespace {

const char* crash_program = "conveyor";

void OnCrash(int sig) {
  // Async-signal-safe only: write(2) and backtrace_symbols_fd.
  char line[160];
  const int n = std::snprintf(line, sizeof line, "\n%s: fatal signal %d (%s); backtrace:\n", crash_program, sig,
                              sig == SIGSEGV ? "SIGSEGV" : sig == SIGABRT ? "SIGABRT" : sig == SIGBUS ? "SIGBUS" : "");
  if (n > 0) (void)!write(STDERR_FILENO, line, static_cast<std::size_t>(n));
  void* frames[64];
  backtrace_symbols_fd(frames, backtrace(frames, 64), STDERR_FILENO);
  raise(sig);  // the handler was reset: the default action now
}

}  // namespace

void BoundMallocArenas() {
#if defined(__GLIBC__)
  if (std::getenv("MALLOC_ARENA_MAX") == nullptr) mallopt(M_ARENA_MAX, 2);
#endif
}

void InstallCrashHandler(const char* program) {
  crash_program = program;
  static char alt_stack[1 << 16];  // a stack overflow still gets its report
  stack_t ss{};
  ss.ss_sp = alt_stack;
  ss.ss_size = sizeof alt_stack;
  sigaltstack(&ss, nullptr);
  void* warm[1];
  backtrace(warm, 1);  // loads libgcc now, not inside the handler
  struct sigaction sa {};
  sa.sa_handler = OnCrash;
  sa.sa_flags = SA_RESETHAND | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) sigaction(sig, &sa, nullptr);
  // A write to a socket or pipe whose peer is gone fails with EPIPE, which
  // the code handles, instead of killing the process: a stage server died of
  // SIGPIPE when its replica peer was killed during a Gloo all-reduce
  // (Recovery.ChaosWithTheOptimizerShardedOverTwoReplicasEndsAtTheUninterruptedDigest).
  signal(SIGPIPE, SIG_IGN);
}

void BlockTerminationSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

int WaitForSignal(std::initializer_list<int> signals) {
  sigset_t set;
  sigemptyset(&set);
  for (int s : signals) sigaddset(&set, s);
  // While it waits, the main thread hands the heap's freed pages back to the
  // system once a minute: glibc keeps what its arenas free, and a server's
  // resident memory crept up by a few bytes a step over days while its live
  // heap stayed flat (docs/operations.md, "A week-long job").
  const timespec every{60, 0};
  for (;;) {
    const int sig = sigtimedwait(&set, nullptr, &every);
    if (sig > 0) return sig;
#if defined(__GLIBC__)
    if (errno == EAGAIN) malloc_trim(0);
#endif
  }
}

int WaitForTerminationSignal() { return WaitForSignal({SIGINT, SIGTERM, SIGHUP}); }

}  // namespace conveyor
