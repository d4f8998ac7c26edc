// A started gRPC server: the bound address (port 0 picks a free one), the
// standard health service, message-size limits, keepalive, and an optional
// port file written once the server accepts calls. It is secured as the
// process is configured (SetProcessTls in common/security.h): mutual TLS, every
// client presenting a certificate from the CA, or insecure by default.
#pragma once

#include <grpcpp/server.h>

#include <initializer_list>

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace conveyor {

class GrpcServer {
 public:
  // `services` are not owned and must outlive the server. UNAVAILABLE when the
  // address cannot be bound.
  static StatusOr<std::unique_ptr<GrpcServer>> Start(const std::string& listen,
                                                     const std::vector<grpc::Service*>& services,
                                                     const std::string& port_file = "");
  ~GrpcServer();
  GrpcServer(const GrpcServer&) = delete;
  GrpcServer& operator=(const GrpcServer&) = delete;

  // "host:port" with the port actually bound.
  const std::string& address() const { return address_; }
  int port() const { return port_; }

  // Idempotent. Ends calls in flight after `grace_seconds`.
  void Shutdown(double grace_seconds = 2.0);

 private:
  class Health;  // the standard health service (server.cpp)

  GrpcServer();
  std::unique_ptr<Health> health_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  int port_ = 0;
  bool shut_down_ = false;
};

// Blocks SIGINT, SIGTERM and SIGHUP (a closed terminal) in this thread and
// every thread created after it; call first thing in main().
// WaitForTerminationSignal() then returns the signal when one arrives: each
// ends a server gracefully, as SIGTERM does.
void BlockTerminationSignals();
int WaitForTerminationSignal();
// Waits for one of `signals` (blocked in every thread, as above) and returns
// it; meanwhile returns the heap's freed memory to the system once a minute.
int WaitForSignal(std::initializer_list<int> signals);

// On SIGSEGV, SIGBUS, SIGFPE, SIGILL or SIGABRT, writes the signal and a
// backtrace to stderr (the process's log), then dies of the same signal.
// Also ignores SIGPIPE: a write to a closed peer fails with EPIPE instead.
void InstallCrashHandler(const char* program);

// Caps glibc's malloc at 2 arenas unless MALLOC_ARENA_MAX says otherwise;
// call first thing in main(), before any thread. With an arena per thread
// (gRPC's, the executor's, LibTorch's) a stage server's resident memory grew
// by 10 to 25 bytes a step while its live heap stayed flat (heaptrack: the
// same peak after 5,000 and 25,000 steps); with 2 it grew by 2 to 7
// (docs/operations.md, "A week-long job").
void BoundMallocArenas();

}  // namespace conveyor
