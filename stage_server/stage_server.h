// A stage server: one Stage behind its gRPC services, on one device.
#pragma once

#include <memory>
#include <string>

#include "common/files.h"
#include "common/server.h"
#include "stage_server/stage.h"

namespace conveyor {

struct StageServerOptions {
  std::string listen = "127.0.0.1:0";
  std::string port_file;  // written once the server accepts calls
  std::string device = "cpu";
  int threads = 0;
  std::string checkpoint_dir;  // "" : cannot checkpoint
  std::string profile_dir;     // "" : checkpoint_dir
  std::vector<std::string> data_roots;  // see StageOptions
};

class StageServer {
 public:
  static StatusOr<std::unique_ptr<StageServer>> Start(const StageServerOptions& options);
  ~StageServer();
  StageServer(const StageServer&) = delete;
  StageServer& operator=(const StageServer&) = delete;

  const std::string& address() const { return server_->address(); }
  // Idempotent: stops taking calls, then stops the stage.
  void Shutdown();

 private:
  StageServer() = default;
  // Declaration order is destruction order in reverse: the server goes first.
  std::unique_ptr<DirLock> checkpoint_lock_;  // one stage server per checkpoint folder
  std::unique_ptr<TransportFactory> grpc_transports_;
  std::unique_ptr<TransportFactory> transports_;  // counts the bytes sent through grpc_transports_
  std::unique_ptr<Stage> stage_;
  std::unique_ptr<grpc::Service> control_, data_;
  std::unique_ptr<GrpcServer> server_;
};

}  // namespace conveyor
