// stage_server: one pipeline stage on one device, driven by a coordinator.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "common/command_line.h"
#include "model/device.h"
#include "plan/job_spec.h"
#include "common/net.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/security.h"
#include "stage_server/stage_server.h"

int main(int argc, char** argv) {
  conveyor::BoundMallocArenas();
  conveyor::InstallCrashHandler("stage_server");
  conveyor::BlockTerminationSignals();
  CLI::App app{"Conveyor stage server: owns one partition of a model on one device"};
  app.name("stage_server");
  conveyor::StageServerOptions options;
  std::string log_level = "info";
  app.add_option("--listen", options.listen, "HOST:PORT to serve on (port 0 picks a free port)")
      ->capture_default_str();
  app.add_option("--port-file", options.port_file, "write the bound HOST:PORT here once serving");
  app.add_option("--device", options.device, "cpu, cuda or cuda:N")->capture_default_str();
  app.add_option("--threads", options.threads, "LibTorch intra-op threads (0: 1 on a CUDA device, LibTorch's default on the CPU)")
      ->capture_default_str();
  app.add_option("--checkpoint-dir", options.checkpoint_dir,
                 "folder for this stage's checkpoints (jobs with checkpoint_every need one)");
  options.data_roots = conveyor::DefaultDataRoots();
  app.add_option("--data-root", options.data_roots,
                 "a folder whose files (models, data, weights) jobs may name (repeatable)")
      ->capture_default_str();
  app.add_option("--profile-dir", options.profile_dir,
                 "folder for the traces of jobs with profile_step (default: the checkpoint folder)");
  app.add_option("-v,--log-level", log_level, "trace, debug, info, warn, error, off")->capture_default_str();
  conveyor::TlsFiles tls;
  conveyor::AddTlsFlags(app, &tls);
  conveyor::MetricsFlags metrics_flags;
  conveyor::AddMetricsFlags(app, &metrics_flags);
  bool count_gpus = false;
  app.add_flag("--count-gpus", count_gpus, "print how many CUDA devices this process can use, and exit");
  if (int rc = conveyor::ParseCommandLine(app, argc, argv); rc >= 0) return rc;
  if (count_gpus) {
    std::cout << conveyor::CudaDeviceCount() << std::endl;
    return 0;
  }

  if (conveyor::Status st = conveyor::CheckAddress(options.listen, "--listen", /*listen=*/true); !st.ok())
    return conveyor::UsageError(app, std::string(st.message()));
  if (!conveyor::ConfigureLogging(log_level, "stage")) return conveyor::kExitUsage;
  if (!conveyor::ConfigureTls(tls, "stage_server")) return conveyor::kExitUsage;
  auto metrics = conveyor::metrics::MetricsEndpoint::Start(metrics_flags.listen, metrics_flags.port_file);
  if (!metrics.ok()) return conveyor::StartError(app, metrics.status());
  auto server = conveyor::StageServer::Start(options);
  if (!server.ok()) {
    LOG_ERROR("cannot start: ", server.status().message());
    return conveyor::kExitFailure;
  }
  int sig = conveyor::WaitForTerminationSignal();
  LOG_INFO("signal ", sig, ": shutting down");
  // A step stuck in a device call (a GPU that hangs, an NCCL kernel whose
  // peer is gone) would keep the orderly shutdown from ending, and the
  // process would go on holding its GPU: it has kShutdownGrace, then exits.
  constexpr std::chrono::seconds kShutdownGrace{15};
  std::thread([kShutdownGrace] {
    std::this_thread::sleep_for(kShutdownGrace);
    LOG_ERROR("shutdown took over ", kShutdownGrace.count(), " s (a step stuck on the device?): exiting now");
    std::fflush(nullptr);
    std::_Exit(1);
  }).detach();
  (*server)->Shutdown();
  // Shut down in order above; skip static destructors (see cli/conveyor_main.cpp).
  std::fflush(nullptr);
  std::_Exit(0);
}
