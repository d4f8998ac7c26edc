// coordinator: accepts training jobs and drives them over its stage servers.
#include <CLI/CLI.hpp>
#include <pthread.h>
#include <signal.h>

#include <thread>

#include <cstdio>
#include <cstdlib>

#include "common/command_line.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "plan/job_spec.h"
#include "common/net.h"
#include "common/security.h"
#include "common/server.h"
#include "coordinator/coordinator.h"
#include "coordinator/coordinator_service.h"
#include "coordinator/stage_addresses.h"

namespace {

// The coordinator's command line.
struct CoordinatorFlags {
  std::string listen = "127.0.0.1:50050", port_file, log_level = "info";
  conveyor::CoordinatorOptions options;
  conveyor::TlsFiles tls;
  conveyor::MetricsFlags metrics;
  std::string token_file;
};

void AddCoordinatorFlags(CLI::App& app, CoordinatorFlags* f) {
  app.add_option("--listen", f->listen, "HOST:PORT to serve on (port 0 picks a free port)")->capture_default_str();
  app.add_option("--stages", f->options.stages,
                 "stage server addresses, in pipeline order; an item may be a pattern such as "
                 "stage-{0..3}.stages.NAMESPACE.svc:50051 (docs/operations.md)")
      ->required()
      ->delimiter(',');
  app.add_option("--state-dir", f->options.state_dir, "folder for the job database")->required();
  app.add_option("--port-file", f->port_file, "write the bound HOST:PORT here once serving");
  f->options.data_roots = conveyor::DefaultDataRoots();
  app.add_option("--data-root", f->options.data_roots,
                 "a folder whose files jobs may name (repeatable; relative paths are relative to the first)")
      ->capture_default_str();
  app.add_option("-v,--log-level", f->log_level, "trace, debug, info, warn, error, off")->capture_default_str();
  conveyor::AddTlsFlags(app, &f->tls);
  conveyor::AddMetricsFlags(app, &f->metrics);
  app.add_option("--auth-token-file", f->token_file,
                 "file holding the token that SubmitJob and CancelJob must carry (authorization: Bearer TOKEN)");
}

// SIGUSR1 (a scheduler's warning before preemption: Slurm's --signal)
// checkpoints the running job; blocked here, so that every thread created
// later has it blocked too, and taken by the sigwait in
// CoordinatorServeUntilSignal.
void CoordinatorBlockCheckpointSignal() {
  sigset_t usr1;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &usr1, nullptr);
}

// Serves until SIGINT or SIGTERM, checkpointing the running job at each
// SIGUSR1; then stops the server and the coordinator.
void CoordinatorServeUntilSignal(conveyor::Coordinator& coordinator, conveyor::GrpcServer& server) {
  int sig = 0;
  while ((sig = conveyor::WaitForSignal({SIGINT, SIGTERM, SIGUSR1})) == SIGUSR1) {
    LOG_INFO("SIGUSR1: ", coordinator.CheckpointNow());
  }
  LOG_INFO("signal ", sig, ": shutting down");
  // The server stops taking calls while the jobs stop (a step in flight can
  // take seconds): a client that lost its watch then waits for the next
  // coordinator instead of finding this one still answering. Watches end as
  // the coordinator's shutdown begins.
  std::thread stop_serving([&server] { server.Shutdown(); });
  coordinator.Shutdown();
  stop_serving.join();
}

}  // namespace

int main(int argc, char** argv) {
  conveyor::BoundMallocArenas();
  conveyor::InstallCrashHandler("coordinator");
  conveyor::BlockTerminationSignals();
  CoordinatorBlockCheckpointSignal();
  CLI::App app{"Conveyor coordinator: runs training jobs over pipeline stage servers"};
  app.name("coordinator");
  CoordinatorFlags flags;
  conveyor::CoordinatorOptions& options = flags.options;
  AddCoordinatorFlags(app, &flags);
  if (int rc = conveyor::ParseCommandLine(app, argc, argv); rc >= 0) return rc;
  if (conveyor::Status st = conveyor::CheckAddress(flags.listen, "--listen", /*listen=*/true); !st.ok())
    return conveyor::UsageError(app, std::string(st.message()));
  auto stages = conveyor::ExpandStageAddresses(options.stages);
  if (!stages.ok()) return conveyor::UsageError(app, std::string(stages.status().message()));
  options.stages = std::move(*stages);

  if (!conveyor::ConfigureLogging(flags.log_level, "coordinator")) return conveyor::kExitUsage;
  if (!conveyor::ConfigureTls(flags.tls, "coordinator")) return conveyor::kExitUsage;
  std::string token;
  if (!flags.token_file.empty()) {
    auto read = conveyor::ReadTokenFile(flags.token_file);
    if (!read.ok()) {
      return conveyor::UsageError(app, std::string(read.status().message()));
    }
    token = std::move(*read);
    LOG_INFO("SubmitJob and CancelJob require the token in ", flags.token_file,
             conveyor::ProcessTls() ? "" : " (without TLS it crosses the network in clear text)");
  }
  auto metrics = conveyor::metrics::MetricsEndpoint::Start(flags.metrics.listen, flags.metrics.port_file);
  if (!metrics.ok()) return conveyor::StartError(app, metrics.status());
  conveyor::metrics::RecordProcess("coordinator");
  options.defer_scheduling = true;
  auto coordinator = conveyor::Coordinator::Start(options);
  if (!coordinator.ok()) {
    LOG_ERROR("cannot start: ", coordinator.status().message());
    return conveyor::kExitFailure;
  }
  conveyor::CoordinatorService service(coordinator->get(), token);
  auto server = conveyor::GrpcServer::Start(flags.listen, {&service}, flags.port_file);
  if (!server.ok()) {
    LOG_ERROR("cannot start: ", server.status().message());
    return conveyor::kExitFailure;
  }
  LOG_INFO("coordinator listening on ", (*server)->address(), " with ", options.stages.size(), " stages");
  (*coordinator)->StartScheduling();
  CoordinatorServeUntilSignal(**coordinator, **server);
  // Shut down in order by CoordinatorServeUntilSignal; skip static destructors (see cli/conveyor_main.cpp).
  std::fflush(nullptr);
  std::_Exit(0);
}
