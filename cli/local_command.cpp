#include "cli/local_command.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <thread>

#include "cli/export.h"
#include "cli/job_checks.h"
#include "cli/local_cluster.h"
#include "cli/local_outputs.h"
#include "cli/output.h"
#include "cli/trace.h"
#include "common/command_line.h"
#include "common/files.h"
#include "common/server.h"
#include "plan/job_overrides.h"
#include "plan/placement.h"

namespace conveyor::cli {
namespace {

// Ctrl-C, SIGTERM or SIGHUP (the terminal closed) during `local`: cancel the
// job, and let the normal path tear the cluster down. A second signal gives up
// waiting.
class InterruptWatcher {
 public:
  InterruptWatcher() : thread_([this] { Loop(); }) {}
  ~InterruptWatcher() {
    done_ = true;
    thread_.join();
  }
  void SetJob(v1::Coordinator::Stub* stub, const std::string& job_id) {
    std::lock_guard<std::mutex> lock(mu_);
    stub_ = stub;
    job_id_ = job_id;
  }
  bool interrupted() const { return signals_ > 0; }
  // Blocks until the first signal has come (and the job, if any, was cancelled).
  void WaitForSignal() {
    std::unique_lock<std::mutex> lock(mu_);
    signalled_.wait(lock, [this] { return signals_ > 0; });
  }
  // The shell's exit status for the first signal: 128 + its number.
  int exit_code() const { return 128 + first_.load(); }

 private:
  void Loop() {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    timespec tick{0, 200 * 1000 * 1000};
    while (!done_) {
      const int sig = sigtimedwait(&set, nullptr, &tick);
      if (sig < 0) continue;  // timeout: look at done_ again
      if (++signals_ > 1) {
        std::cerr << "\nconveyor: interrupted again: stopping the cluster now\n";
        std::_Exit(exit_code());  // children get SIGTERM through PR_SET_PDEATHSIG
      }
      first_ = sig;
      std::cerr << "\nconveyor: interrupted: cancelling the job and stopping the cluster\n";
      std::lock_guard<std::mutex> lock(mu_);
      if (stub_) {
        v1::JobRef req;
        req.set_job_id(job_id_);
        v1::JobStatus status;
        grpc::ClientContext ctx;
        ctx.set_deadline(DeadlineAfter(10));
        AddBearerToken(&ctx, BearerToken());
        stub_->CancelJob(&ctx, req, &status);
      }
      signalled_.notify_all();
    }
  }

  std::atomic<bool> done_{false};
  std::atomic<int> signals_{0};
  std::atomic<int> first_{SIGINT};
  std::mutex mu_;  // guards stub_ and job_id_; signalled_ waits under it
  std::condition_variable signalled_;
  v1::Coordinator::Stub* stub_ = nullptr;
  std::string job_id_;
  std::thread thread_;
};

// `conveyor local` on GPUs: a job whose stages outnumber the GPUs runs folded
// (FoldOntoGpus), `yaml` and `spec` becoming the folded job; says what it did,
// or why the stages share GPUs.
Status FoldOntoHost(const std::string& file, int gpus, std::string* yaml, v1::JobSpec* spec) {
  const GpuFold fold = FoldOntoGpus(*spec, gpus);
  if (!fold.why_not.empty()) {
    std::cerr << "note: " << fold.why_not << "; processes that share a GPU take turns on it" << std::endl;
  }
  if (fold.sets.empty()) return absl::OkStatus();
  CONVEYOR_ASSIGN_OR_RETURN(std::string folded, ApplyJobOverrides(*yaml, fold.sets));
  auto parsed = ParseJobYaml(folded);
  if (!parsed.ok()) return Annotate(parsed.status(), file + " folded onto " + std::to_string(gpus) + " GPUs");
  std::cerr << "this host has " << gpus << " GPU(s) for the job's " << fold.stages << " stages: running them as "
            << fold.folded << ", one stage server per GPU, each holding " << (fold.stages % fold.folded ? "about " : "")
            << fold.stages / fold.folded << " of them (the same losses and weights; two processes on one GPU take "
            << "turns on it; --stages " << fold.stages * Replicas(*spec) << " starts one server per stage)" << std::endl;
  *yaml = std::move(folded);
  *spec = std::move(*parsed);
  return absl::OkStatus();
}

// A pipeline of GPU stages runs with one hardware queue per device
// (CUDA_DEVICE_MAX_CONNECTIONS=1 in the stage servers' environment, which
// they inherit) unless the environment already says: W1 over two NCCL-linked
// H100s hung at the first replayed step in about half the runs otherwise, and
// took 19.5 ms a step against 25 (docs/architecture.md, bench/RESULTS.md).
void UseOneHardwareQueue(const v1::JobSpec& spec, int gpus) {
  if (gpus == 0 || spec.partition().stages() < 2 || std::getenv("CUDA_DEVICE_MAX_CONNECTIONS") != nullptr) return;
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1", 1);
  std::cerr << "stage servers start with CUDA_DEVICE_MAX_CONNECTIONS=1 (one hardware queue per GPU, for a pipeline "
               "over NCCL links; set it to keep your own)"
            << std::endl;
}

// One job on a local cluster, from its submission to the cluster's end.
struct LocalRun {
  LocalCluster& cluster;
  InterruptWatcher& interrupts;
  const v1::JobSpec& spec;
  bool json = false;
  bool keep_logs = false;
  std::string job_id;        // empty: no job was submitted
  std::string curves;        // the picture drawn in the run's folder, if any
  std::string weights;       // the weights rescued into the run's folder, if any
  int rc = kExitFailure;
};

// A job that trained but could not write save.path: its stages keep the
// weights until the cluster stops, so this process writes them into the
// run's folder, and says where. If that fails too, the cluster stays up for
// `conveyor export` until a signal.
void RescueWeights(v1::Coordinator::Stub& stub, LocalRun* run) {
  v1::GetJobRequest req;
  req.set_job_id(run->job_id);
  req.set_omit_losses(true);
  v1::JobStatus status;
  if (!Call(stub, &v1::Coordinator::Stub::GetJob, req, &status).ok() || !WeightsKept(status)) return;
  const std::string path = RescuedWeightsPath(run->spec.save_path(), run->cluster.run_dir());
  const std::string format = run->spec.save_format() == v1::SAVE_FORMAT_TORCHSCRIPT ? "torchscript" : "state_dict";
  auto wrote = ExportWeights(status, path, format);
  if (wrote.ok()) {
    run->weights = path;
    std::cerr << "the trained weights are in " << path << " (" << FormatBytes(wrote->bytes)
              << "): save.path " << run->spec.save_path() << " could not take them; move them where there is room"
              << std::endl;
    return;
  }
  std::cerr << "cannot write the trained weights into " << path << " either: " << wrote.status().message()
            << "\nthe cluster keeps them: from another shell, `conveyor --coordinator "
            << run->cluster.coordinator_address() << " export " << run->job_id
            << " --out FILE` writes them where there is room; Ctrl-C stops the cluster" << std::endl;
  run->interrupts.WaitForSignal();
}

// Submits `yaml`, follows the job, and writes what it leaves: the rescued
// weights, the trace, the curves. Returns the exit code.
int RunLocalJob(const std::string& file, const std::string& yaml, const std::string& trace_prefix,
                const std::string& curves, LocalRun* run) {
  if (run->interrupts.interrupted()) return run->interrupts.exit_code();
  auto stub = Connect(run->cluster.coordinator_address());
  auto id = SubmitText(*stub, yaml);
  if (!id.ok()) return Fail(Annotate(id.status(), file));
  run->job_id = *id;
  run->interrupts.SetJob(stub.get(), *id);
  std::cerr << "submitted " << *id << std::endl;
  int rc = WatchUntilDone(*stub, *id, run->json);
  run->interrupts.SetJob(nullptr, "");
  if (rc != 0 && !run->spec.save_path().empty() && !run->interrupts.interrupted()) RescueWeights(*stub, run);
  if (rc == 0 && !trace_prefix.empty()) rc = WriteStepTrace(*stub, *id, -1, trace_prefix, std::cerr);
  if (curves.empty() || run->interrupts.interrupted()) return rc;
  std::string png = curves;
  if (png == "auto") {  // a name no other run has: beside the weights, or in this run's folder
    auto reserved = ReserveCurvesPicture(run->spec.save_path(), run->cluster.run_dir());
    if (!reserved.ok()) {
      std::cerr << "no curves: " << reserved.status().message() << "\n";
      return rc;
    }
    png = *reserved;
  }
  Status drawn = DrawCurves(*stub, *id, png, std::cerr);
  if (!drawn.ok()) {
    std::cerr << "no curves: " << drawn.message() << "\n";
    if (curves == "auto") ::unlink(png.c_str());  // the empty file reserved above
  } else if (png.rfind(run->cluster.run_dir() + "/", 0) == 0) {
    run->curves = png;
  }
  return rc;
}

// Stops the cluster and says what stays of the run: its folder is removed
// for a job that never started, and for one that succeeded (but for its
// curves picture, and unless --keep-logs); otherwise it says where it is.
int EndLocalRun(LocalRun* run) {
  run->cluster.Stop();
  const std::string& dir = run->cluster.run_dir();
  if (run->job_id.empty()) {
    RemoveTree(dir);  // nothing ran: its logs say only that the servers started
  } else if (run->rc == 0 && !run->keep_logs) {
    for (const std::string& name : ListDir(dir)) {  // RemoveTree: std::filesystem's walks crash under a wheel's LibTorch
      if (dir + "/" + name != run->curves) RemoveTree(dir + "/" + name);
    }
    if (run->curves.empty()) {
      RemoveTree(dir);
      std::cerr << "removed " << dir << " (logs of a job that succeeded; --keep-logs keeps them)\n";
    } else {
      std::cerr << "removed the logs in " << dir << " (a job that succeeded; --keep-logs keeps them); its curves stay in "
                << run->curves << "\n";
    }
  } else {
    std::cerr << "logs kept in " << dir << (run->weights.empty() ? "" : ", with the trained weights") << "\n";
  }
  return run->interrupts.interrupted() ? run->interrupts.exit_code() : run->rc;
}

}  // namespace

int CmdLocal(const Common& c, const std::string& file, int stages, const std::string& device,
             const std::string& trace_prefix, const std::string& profile_dir, bool keep_logs, std::string curves) {
  std::string yaml;
  v1::JobSpec job;
  bool printed = false;
  if (Status st = ReadJob(c, file, &yaml, &job, &printed); !st.ok()) return Fail(st);
  if (printed) return 0;
  v1::JobSpec* spec = &job;
  LocalClusterOptions options;
  options.bin_dir = ExecutableDir();
  const int gpus = device == "cpu" ? 0 : CountGpus(options.bin_dir);
  if (device == "cuda" && gpus == 0) return Fail(absl::FailedPreconditionError("--device cuda: no CUDA device here"));
  if (stages == 0) {  // one stage server per GPU (plan/placement.h); --stages N starts N
    if (Status folded = FoldOntoHost(file, gpus, &yaml, spec); !folded.ok()) return Fail(folded);
  }
  UseOneHardwareQueue(*spec, gpus);
  options.data_roots = JobDataRoots(file);
  if (Status files = ResolveJobPaths(spec, options.data_roots); !files.ok()) return Fail(Annotate(files, file));
  // What would fail the job at once fails it before any server starts.
  if (Status checked = CheckJobBeforeStart(*spec); !checked.ok()) return Fail(Annotate(checked, file));
  options.stages = stages > 0 ? stages : Replicas(*spec) * std::max(1, spec->partition().stages());
  options.log_level = c.log_level == "warn" ? "info" : c.log_level;
  for (int i = 0; i < options.stages; ++i)
    options.devices.push_back(gpus > 0 ? "cuda:" + std::to_string(i % gpus) : "cpu");
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // GPU stages take their own default (model/device.h: one thread on CUDA).
  options.threads_per_stage = gpus > 0 ? 0 : std::max(1, cores / options.stages);
  // CPU stages share the host's cores with each other, the coordinator and
  // their own gRPC and link threads; LibTorch's OpenMP workers spin after
  // every operation before they sleep (libgomp: 300000 spins), on cores the
  // others need: a one-stage toy job on 2 cores spent 40% of its CPU time so.
  // Sleeping at once (OMP_WAIT_POLICY=PASSIVE) halved the toy's step but made
  // a one-stage ConvNet 2.3x slower; 30000 spins gave the toy 21% and the
  // ConvNet nothing either way (2-core CPU machine, 2026-11-26, bench/RESULTS.md). A stage of
  // one thread has no OpenMP workers.
  std::string omp;
  if (gpus == 0 && options.threads_per_stage > 1 && std::getenv("OMP_WAIT_POLICY") == nullptr &&
      std::getenv("GOMP_SPINCOUNT") == nullptr) {
    options.stage_env.push_back("GOMP_SPINCOUNT=30000");
    omp = "; OpenMP workers spin 30000 times between operations: GOMP_SPINCOUNT, set it or OMP_WAIT_POLICY to "
          "keep your own";
  }
  options.tls = c.tls;
  options.auth_token = BearerToken();
  if (spec->profile_step() > 0) options.profile_dir = std::filesystem::absolute(profile_dir).string();

  BlockTerminationSignals();
  InterruptWatcher interrupts;
  std::cerr << "starting " << options.stages << " stage server(s) on " << (gpus > 0 ? "GPUs" : "CPU") << " ("
            << (options.threads_per_stage > 0 ? options.threads_per_stage : 1) << " thread(s) each" << omp
            << ") and a coordinator" << std::endl;
  auto cluster = LocalCluster::Start(options);
  if (!cluster.ok()) return Fail(cluster.status());
  std::cerr << "cluster up: coordinator " << (*cluster)->coordinator_address() << ", logs in "
            << (*cluster)->run_dir() << std::endl;
  LocalRun run{**cluster, interrupts, *spec, c.json, keep_logs};
  run.rc = RunLocalJob(file, yaml, trace_prefix, curves, &run);
  return EndLocalRun(&run);
}

}  // namespace conveyor::cli
