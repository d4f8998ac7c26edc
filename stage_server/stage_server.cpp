#include "stage_server/stage_server.h"

#include <cstdlib>

#include "common/logging.h"
#include "transport/grpc/grpc_transport.h"
#include "stage_server/stage_metrics.h"
#include "stage_server/stage_service.h"
#include "transport/grpc/stage_data_service.h"

namespace conveyor {

StatusOr<std::unique_ptr<StageServer>> StageServer::Start(const StageServerOptions& options) {
  std::unique_ptr<StageServer> s(new StageServer());
  if (!options.checkpoint_dir.empty()) {
    CONVEYOR_ASSIGN_OR_RETURN(s->checkpoint_lock_, DirLock::Acquire(options.checkpoint_dir, "checkpoint folder"));
  }
  s->grpc_transports_ = std::make_unique<GrpcTransportFactory>();
  s->transports_ = CountingTransports(s->grpc_transports_.get());
  StageOptions stage_options;
  stage_options.device = options.device;
  stage_options.threads = options.threads;
  stage_options.checkpoint_dir = options.checkpoint_dir;
  stage_options.profile_dir = options.profile_dir;
  stage_options.data_roots = options.data_roots;
  stage_options.transports = s->transports_.get();
  CONVEYOR_ASSIGN_OR_RETURN(s->stage_, Stage::Create(stage_options));
  s->control_ = std::make_unique<StageControlService>(s->stage_.get());
  s->data_ = std::make_unique<StageDataService>(&s->stage_->inbox(), options.device);
  CONVEYOR_ASSIGN_OR_RETURN(s->server_, GrpcServer::Start(options.listen, {s->control_.get(), s->data_.get()},
                                                          options.port_file));
  // How OpenMP workers wait (conveyor local's CPU stages: GOMP_SPINCOUNT=30000).
  std::string omp;
  for (const char* name : {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT"})
    if (const char* v = std::getenv(name)) omp += std::string(", ") + name + "=" + v;
  LOG_INFO("stage server listening on ", s->server_->address(), ", device ", options.device, omp);
  return s;
}

StageServer::~StageServer() { Shutdown(); }

void StageServer::Shutdown() {
  if (stage_) stage_->Shutdown();                  // wakes a step waiting on a neighbour
  if (server_) server_->Shutdown();
}

}  // namespace conveyor
