#include "common/server.h"

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
