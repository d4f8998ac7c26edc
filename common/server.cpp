#include "common/server.h"

#include <execinfo.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>

#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/server_builder.h>

#include <csignal>

#include "common/logging.h"
#include "common/net.h"
#include "common/security.h"

namespace conveyor {

StatusOr<std::unique_ptr<GrpcServer>> GrpcServer::Start(const std::string& listen,
                                                        const std::vector<grpc::Service*>& services,
                                                        const std::string& port_file) {
  auto colon = listen.rfind(':');
  if (colon == std::string::npos || colon == 0)
    return absl::InvalidArgumentError("listen address '" + listen + "' is not HOST:PORT");
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  std::unique_ptr<GrpcServer> server(new GrpcServer());
  builder.AddListeningPort(listen, ServerCredentials(ProcessTls()), &server->port_);
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(-1);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  for (grpc::Service* s : services) builder.RegisterService(s);
  server->server_ = builder.BuildAndStart();
  if (!server->server_ || server->port_ == 0)
    return absl::UnavailableError("cannot listen on " + listen + " (address in use or not local?)");
  server->address_ = listen.substr(0, colon) + ":" + std::to_string(server->port_);
  if (!port_file.empty()) CONVEYOR_RETURN_IF_ERROR(WriteFileAtomically(port_file, server->address_ + "\n"));
  return server;
}

GrpcServer::~GrpcServer() { Shutdown(); }

void GrpcServer::Shutdown(double grace_seconds) {
  if (shut_down_ || !server_) return;
  shut_down_ = true;
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
}

void BlockTerminationSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

int WaitForTerminationSignal() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  int sig = 0;
  sigwait(&set, &sig);
  return sig;
}

}  // namespace conveyor
