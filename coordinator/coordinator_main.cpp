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

int main(int argc, char** argv) {
  conveyor::InstallCrashHandler("coordinator");
  conveyor::BlockTerminationSignals();
  // SIGUSR1 (a scheduler's warning before preemption: Slurm's --signal)
  // checkpoints the running job; blocked here, so that every thread created
  // later has it blocked too, and taken by the sigwait below.
  sigset_t usr1;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &usr1, nullptr);
  CLI::App app{"Conveyor coordinator: runs training jobs over pipeline stage servers"};
  app.name("coordinator");
  std::string listen = "127.0.0.1:50050", port_file, log_level = "info";
  conveyor::CoordinatorOptions options;
  app.add_option("--listen", listen, "HOST:PORT to serve on (port 0 picks a free port)")->capture_default_str();
  app.add_option("--stages", options.stages,
                 "stage server addresses, in pipeline order; an item may be a pattern such as "
                 "stage-{0..3}.stages.NAMESPACE.svc:50051 (docs/operations.md)")
      ->required()
      ->delimiter(',');
  app.add_option("--state-dir", options.state_dir, "folder for the job database")->required();
  app.add_option("--port-file", port_file, "write the bound HOST:PORT here once serving");
  options.data_roots = conveyor::DefaultDataRoots();
  app.add_option("--data-root", options.data_roots,
                 "a folder whose files jobs may name (repeatable; relative paths are relative to the first)")
      ->capture_default_str();
  app.add_option("-v,--log-level", log_level, "trace, debug, info, warn, error, off")->capture_default_str();
  conveyor::TlsFiles tls;
  conveyor::AddTlsFlags(app, &tls);
  conveyor::MetricsFlags metrics_flags;
  conveyor::AddMetricsFlags(app, &metrics_flags);
  std::string token_file;
  app.add_option("--auth-token-file", token_file,
                 "file holding the token that SubmitJob and CancelJob must carry (authorization: Bearer TOKEN)");
  if (int rc = conveyor::ParseCommandLine(app, argc, argv); rc >= 0) return rc;
  if (conveyor::Status st = conveyor::CheckAddress(listen, "--listen", /*listen=*/true); !st.ok())
    return conveyor::UsageError(app, std::string(st.message()));
  auto stages = conveyor::ExpandStageAddresses(options.stages);
  if (!stages.ok()) return conveyor::UsageError(app, std::string(stages.status().message()));
  options.stages = std::move(*stages);

  if (!conveyor::ConfigureLogging(log_level, "coordinator")) return conveyor::kExitUsage;
  if (!conveyor::ConfigureTls(tls, "coordinator")) return conveyor::kExitUsage;
  std::string token;
  if (!token_file.empty()) {
    auto read = conveyor::ReadTokenFile(token_file);
    if (!read.ok()) {
      return conveyor::UsageError(app, std::string(read.status().message()));
    }
    token = std::move(*read);
    LOG_INFO("SubmitJob and CancelJob require the token in ", token_file,
             conveyor::ProcessTls() ? "" : " (without TLS it crosses the network in clear text)");
  }
  auto metrics = conveyor::metrics::MetricsEndpoint::Start(metrics_flags.listen, metrics_flags.port_file);
  if (!metrics.ok()) return conveyor::StartError(app, metrics.status());
  conveyor::metrics::RecordProcess("coordinator");
  options.defer_scheduling = true;
  auto coordinator = conveyor::Coordinator::Start(options);
  if (!coordinator.ok()) {
    LOG_ERROR("cannot start: ", coordinator.status().message());
    return conveyor::kExitFailure;
  }
  conveyor::CoordinatorService service(coordinator->get(), token);
  auto server = conveyor::GrpcServer::Start(listen, {&service}, port_file);
  if (!server.ok()) {
    LOG_ERROR("cannot start: ", server.status().message());
    return conveyor::kExitFailure;
  }
  LOG_INFO("coordinator listening on ", (*server)->address(), " with ", options.stages.size(), " stages");
  (*coordinator)->StartScheduling();
  sigset_t wanted;
  sigemptyset(&wanted);
  for (int s : {SIGINT, SIGTERM, SIGUSR1}) sigaddset(&wanted, s);
  int sig = 0;
  while (sigwait(&wanted, &sig) == 0 && sig == SIGUSR1) {
    LOG_INFO("SIGUSR1: ", (*coordinator)->CheckpointNow());
  }
  LOG_INFO("signal ", sig, ": shutting down");
  // The server stops taking calls while the jobs stop (a step in flight can
  // take seconds): a client that lost its watch then waits for the next
  // coordinator instead of finding this one still answering. Watches end as
  // the coordinator's shutdown begins.
  std::thread stop_serving([&server] { (*server)->Shutdown(); });
  (*coordinator)->Shutdown();
  stop_serving.join();
  // Shut down in order above; skip static destructors (see cli/conveyor_main.cpp).
  std::fflush(nullptr);
  std::_Exit(0);
}
