// The `conveyor` binary as a user runs it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "cli/local_cluster.h"
#include "common/files.h"
#include "tests/support/test_util.h"

namespace conveyor {
namespace {

using ::testing::HasSubstr;
using testing::Binary;
using testing::RunCommand;

std::string Example(const std::string& name) { return std::string(CONVEYOR_SOURCE_DIR) + "/examples/" + name; }

TEST(Cli, EveryProgramHasHelp) {
  for (const char* bin : {"conveyor", "conveyor-torch", "stage_server", "coordinator"}) {
    auto r = RunCommand({Binary(bin), "--help"});
    EXPECT_EQ(r.exit_code, 0) << bin;
    EXPECT_THAT(r.out, HasSubstr("Usage")) << bin;
  }
  auto r = RunCommand({Binary("conveyor"), "local", "--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_THAT(r.out, HasSubstr("--stages"));
}

// `conveyor` is linked without LibTorch, so that each call starts at once; its
// two LibTorch commands run in conveyor-torch from its own folder, and where
// that is missing they say so and how to build it.
TEST(Cli, ConveyorLoadsNoLibTorchAndNamesConveyorTorchWhereItIsMissing) {
  auto libs = RunCommand({"ldd", Binary("conveyor")});
  ASSERT_EQ(libs.exit_code, 0) << libs.err;
  EXPECT_THAT(libs.out, HasSubstr("libgrpc"));
  EXPECT_THAT(libs.out, ::testing::Not(HasSubstr("libtorch")));
  auto torch = RunCommand({"ldd", Binary("conveyor-torch")});
  EXPECT_THAT(torch.out, HasSubstr("libtorch"));

  testing::ScopedTempDir tmp("cli-alone");
  const std::string dir = tmp.path();
  std::filesystem::copy_file(Binary("conveyor"), dir + "/conveyor");
  auto r = RunCommand({dir + "/conveyor", "train", Example("toy.yaml"), "--reference"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("FAILED_PRECONDITION"));
  EXPECT_THAT(r.err, HasSubstr((std::filesystem::canonical(dir) / "conveyor-torch").string()));
  EXPECT_THAT(r.err, HasSubstr("scripts/build.sh programs"));
  r = RunCommand({dir + "/conveyor", "export", "job-1", "--checkpoint-dir", dir, "--out", dir + "/w.pt"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("conveyor-torch"));
  r = RunCommand({dir + "/conveyor", "train", Example("toy.yaml"), "--reference", "--dry-run"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST(Cli, LocalRunMatchesTheReference) {
  auto ref = RunCommand({Binary("conveyor"), "train", Example("toy.yaml"), "--reference", "--json"});
  ASSERT_EQ(ref.exit_code, 0) << ref.err;
  auto local = RunCommand({Binary("conveyor"), "local", Example("toy.yaml"), "--json", "--device", "cpu", "--curves", ""});
  ASSERT_EQ(local.exit_code, 0) << local.err;
  auto a = nlohmann::json::parse(local.out);
  auto b = nlohmann::json::parse(ref.out);
  EXPECT_EQ(a["state"], "succeeded");
  for (const char* key : {"job_id", "steps", "losses", "final_loss", "samples_per_second", "eval_accuracy", "eval_loss",
                          "eval_perplexity", "lrs", "grad_norms", "step_seconds",
                          "param_digest"}) {
    EXPECT_TRUE(a.contains(key)) << key;
    EXPECT_TRUE(b.contains(key)) << key;
  }
  EXPECT_EQ(a["step_seconds"].size(), a["losses"].size());
  EXPECT_EQ(b["step_seconds"].size(), b["losses"].size());
  ASSERT_EQ(a["losses"].size(), b["losses"].size());
  for (std::size_t i = 0; i < a["losses"].size(); ++i) {
    double x = a["losses"][i], y = b["losses"][i];
    EXPECT_NEAR(x, y, testing::kAtol + testing::kRtol * std::abs(y)) << "step " << i;
    // Each step's learning rate and global gradient norm, as the reference has them.
    EXPECT_EQ(a["lrs"][i], b["lrs"][i]) << "step " << i;
    double n = a["grad_norms"][i], m = b["grad_norms"][i];
    EXPECT_NEAR(n, m, testing::kAtol + testing::kRtol * std::abs(m)) << "step " << i;
  }
  EXPECT_EQ(a["eval_accuracy"], b["eval_accuracy"]);
  EXPECT_THAT(local.err, HasSubstr("test accuracy"));  // the summary
  EXPECT_THAT(local.err, HasSubstr("(logs of a job that succeeded; --keep-logs keeps them)"));
}

// The named operators of a trace that profile_step wrote, by category.
std::map<std::string, std::set<std::string>> TraceOperators(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "no trace at " << path;
  std::map<std::string, std::set<std::string>> ops;
  if (!in.good()) return ops;
  nlohmann::json trace = nlohmann::json::parse(in);
  for (const auto& e : trace["traceEvents"]) ops[e["cat"].get<std::string>()].insert(e["name"].get<std::string>());
  return ops;
}

TEST(Cli, ProfileStepWritesATraceOfThatStepPerStageAndForTheReference) {
  const std::string dir = testing::MakeTempDir("profile");
  const std::string job = dir + "/toy.yaml";
  {
    std::ifstream in(Example("toy.yaml"));
    std::ofstream out(job);
    out << in.rdbuf() << "profile_step: 3\nsteps: 4\n";
  }
  auto ref = RunCommand({Binary("conveyor"), "train", job, "--reference", "--json", "--profile-dir", dir + "/ref"});
  ASSERT_EQ(ref.exit_code, 0) << ref.err;
  auto local = RunCommand(
      {Binary("conveyor"), "local", job, "--json", "--device", "cpu", "--profile-dir", dir + "/local", "--curves", ""});
  ASSERT_EQ(local.exit_code, 0) << local.err;
  // The toy's layers: Linear | ReLU | Linear, one per stage. Only step 3 is there.
  auto reference = TraceOperators(dir + "/ref/reference-step3-reference.json");
  EXPECT_TRUE(reference["cpu_op"].count("aten::addmm"));
  EXPECT_TRUE(reference["cpu_op"].count("aten::relu"));
  auto first = TraceOperators(dir + "/local/job-1-step3-stage0.json");
  auto middle = TraceOperators(dir + "/local/job-1-step3-stage1.json");
  EXPECT_TRUE(first["cpu_op"].count("aten::addmm"));
  EXPECT_FALSE(first["cpu_op"].count("aten::relu"));
  EXPECT_TRUE(middle["cpu_op"].count("aten::relu"));
  EXPECT_FALSE(middle["cpu_op"].count("aten::addmm"));
  std::vector<std::string> names = ListDir(dir + "/local");
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"job-1-step3-stage0.json", "job-1-step3-stage1.json",
                                             "job-1-step3-stage2.json"}));
  RemoveTree(dir);
}

TEST(Cli, JobCommandsAgainstARunningCoordinator) {
  cli::LocalClusterOptions options;
  options.remove_run_dir = true;
  options.stages = 1;
  options.bin_dir = CONVEYOR_BIN_DIR;
  auto cluster = cli::LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string coord = (*cluster)->coordinator_address();
  const testing::ScopedTempDir folder("cli");
  const std::string bad = folder.path() + "/bad-job.yaml";
  std::ofstream(bad) << "model: toy\nbatch_size: 8\nmicro_batches: 9\n";
  auto r = RunCommand({Binary("conveyor"), "--coordinator", coord, "submit", bad});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("micro_batches: 9 is larger than batch_size 8"));
  EXPECT_THAT(r.err, HasSubstr("INVALID_ARGUMENT"));

  r = RunCommand({Binary("conveyor"), "--coordinator", coord, "submit", Example("toy.yaml"), "--wait", "--json"});
  EXPECT_NE(r.exit_code, 0);  // toy.yaml wants 3 stages; this cluster has 1
  EXPECT_THAT(r.err, HasSubstr("needs 3 stages"));

  const std::string one = folder.path() + "/one-stage.yaml";
  std::ofstream(one) << "name: tiny\nmodel: toy\nsteps: 3\n";
  r = RunCommand({Binary("conveyor"), "--coordinator", coord, "submit", one, "--wait", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  const std::string id = j["job_id"];
  EXPECT_EQ(j["steps"], 3);

  r = RunCommand({Binary("conveyor"), "--coordinator", coord, "status", id});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_THAT(r.out, HasSubstr("succeeded"));
  r = RunCommand({Binary("conveyor"), "--coordinator", coord, "list"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_THAT(r.out, HasSubstr(id));
  EXPECT_THAT(r.out, HasSubstr("tiny"));
  r = RunCommand({Binary("conveyor"), "--coordinator", coord, "status", "job-404"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("NOT_FOUND"));
  r = RunCommand({Binary("conveyor"), "--coordinator", coord, "cancel", id});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("already succeeded"));
  r = RunCommand({Binary("conveyor"), "health", (*cluster)->stage_addresses()[0]});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("SERVING"));
}

// Reads `fd` until `marker` has been seen (or EOF, or 120 s without output).
std::string ReadUntil(int fd, const std::string& marker, std::string* all) {
  char buf[4096];
  while (all->find(marker) == std::string::npos) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 120000) <= 0) break;
    ssize_t n = read(fd, buf, sizeof buf);
    if (n <= 0) break;
    all->append(buf, static_cast<std::size_t>(n));
  }
  return *all;
}

// Processes whose command line mentions `needle`.
int ProcessesMentioning(const std::string& needle) {
  int found = 0;
  for (const std::string& pid : ListDir("/proc")) {  // processes come and go while /proc is read
    std::ifstream in("/proc/" + pid + "/cmdline");
    std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    if (cmdline.find(needle) != std::string::npos) ++found;
  }
  return found;
}

// Ctrl-C, and SIGHUP (the terminal closed: it exited 129 at once, leaving
// the cluster's logs), cancel the job and stop the cluster; the exit status
// is the shell's for the signal.
class Interrupt : public ::testing::TestWithParam<int> {};
INSTANTIATE_TEST_SUITE_P(Cli, Interrupt, ::testing::Values(SIGINT, SIGHUP),
                         [](const ::testing::TestParamInfo<int>& i) { return i.param == SIGHUP ? "SIGHUP" : "SIGINT"; });

TEST_P(Interrupt, CancelsTheJobAndStopsTheCluster) {
  const testing::ScopedTempDir folder("cli");
  const std::string job = folder.path() + "/endless.yaml";
  std::ofstream(job) << "name: endless\nmodel: toy\npartition: {stages: 2}\nsteps: 100000000\n";
  int err[2];
  ASSERT_EQ(pipe2(err, O_CLOEXEC), 0);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(err[1], STDERR_FILENO);
    int null = open("/dev/null", O_WRONLY);
    dup2(null, STDOUT_FILENO);
    const std::string bin = Binary("conveyor");
    // --json: the summary goes to stderr, which the test reads.
    execl(bin.c_str(), bin.c_str(), "local", job.c_str(), "--device", "cpu", "--json", "--curves", "",
          static_cast<char*>(nullptr));
    _exit(127);
  }
  close(err[1]);
  std::string output;
  ReadUntil(err[0], "submitted job-", &output);
  ASSERT_NE(output.find("submitted job-"), std::string::npos) << output;
  const auto logs = output.find("logs in ");
  ASSERT_NE(logs, std::string::npos) << output;
  const std::string run_dir = output.substr(logs + 8, output.find('\n', logs) - logs - 8);
  EXPECT_EQ(ProcessesMentioning(run_dir), 3);  // two stage servers and the coordinator
  kill(pid, GetParam());
  ReadUntil(err[0], "\x04", &output);  // everything, until the CLI closes stderr
  close(err[0]);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status)) << output;
  EXPECT_EQ(WEXITSTATUS(status), 128 + GetParam()) << output;
  EXPECT_NE(output.find("interrupted: cancelling the job"), std::string::npos) << output;
  EXPECT_NE(output.find("cancelled"), std::string::npos) << output;
  EXPECT_EQ(ProcessesMentioning(run_dir), 0) << "the cluster outlived the CLI";
  RemoveTree(run_dir);  // logs kept for a failed or interrupted job
}

TEST(Cli, AFailedLocalJobStopsTheClusterToo) {
  // NCCL between CPU stages: accepted at submission, refused when the links are set up.
  const testing::ScopedTempDir folder("cli");
  const std::string job = folder.path() + "/cpu-nccl.yaml";
  std::ofstream(job) << "model: toy\npartition: {stages: 2}\ntransport: nccl\n";
  auto r = RunCommand({Binary("conveyor"), "local", job, "--device", "cpu", "--curves", ""});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.out, HasSubstr("failed"));
  EXPECT_THAT(r.out, HasSubstr("cannot use NCCL"));
  const auto logs = r.err.find("logs kept in ");
  ASSERT_NE(logs, std::string::npos) << r.err;
  const std::string run_dir = r.err.substr(logs + 13, r.err.find('\n', logs) - logs - 13);
  EXPECT_TRUE(std::filesystem::exists(run_dir + "/coordinator.log"));
  EXPECT_EQ(ProcessesMentioning(run_dir), 0) << "the cluster outlived the CLI";
  RemoveTree(run_dir);  // logs kept for a failed or interrupted job
}

// `conveyor local` on the CPU starts stages of several threads with
// GOMP_SPINCOUNT=30000 (their OpenMP workers would spin ten times longer on
// the cores the other processes and threads need), says so, and keeps what
// the user set.
TEST(Cli, CpuStagesOfSeveralThreadsSpinLessBetweenOperations) {
  if (std::thread::hardware_concurrency() < 2) GTEST_SKIP() << "one core: one thread a stage, no OpenMP workers";
  const testing::ScopedTempDir folder("cli");
  const std::string job = folder.path() + "/one-stage.yaml";
  std::ofstream(job) << "model: toy\npartition: {stages: 1}\nsteps: 3\n";
  for (const std::string set : {"", "GOMP_SPINCOUNT=5", "OMP_WAIT_POLICY=ACTIVE"}) {
    SCOPED_TRACE("environment: '" + set + "'");
    std::vector<std::string> cmd = {Binary("conveyor"), "local", job, "--device", "cpu", "--curves", "", "--keep-logs"};
    if (!set.empty()) cmd.insert(cmd.begin(), {"env", set});
    auto r = RunCommand(cmd);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.err.find("GOMP_SPINCOUNT, set it") != std::string::npos, set.empty()) << r.err;
    const auto logs = r.err.find("logs kept in ");
    ASSERT_NE(logs, std::string::npos) << r.err;
    const std::string run_dir = r.err.substr(logs + 13, r.err.find('\n', logs) - logs - 13);
    std::stringstream log;
    log << std::ifstream(run_dir + "/stage-0.log").rdbuf();
    EXPECT_THAT(log.str(), HasSubstr(set.empty() ? std::string("GOMP_SPINCOUNT=30000") : set));
    if (!set.empty()) EXPECT_THAT(log.str(), ::testing::Not(HasSubstr("GOMP_SPINCOUNT=30000")));
    RemoveTree(run_dir);
  }
}

TEST(Cli, ReferenceNamesABadJobFile) {
  const testing::ScopedTempDir folder("cli");
  const std::string bad = folder.path() + "/typo.yaml";
  std::ofstream(bad) << "model: toy\nepoch: 3\n";
  auto r = RunCommand({Binary("conveyor"), "train", bad, "--reference"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("epoch: unknown key"));
}

// --set on the command line: `train --dry-run` prints the effective job (the
// file with the overrides applied) and runs nothing; without it the job runs
// with them; a bad override is named with the nearest key, and a bad value as
// in a file.
TEST(Cli, SetOverridesTheJobFileAndDryRunPrintsTheEffectiveJob) {
  const testing::ScopedTempDir folder("cli");
  const std::string job = folder.path() + "/overrides.yaml";
  std::ofstream(job) << "model: toy\nbatch_size: 8\nsteps: 5\noptimizer: {name: sgd, lr: 0.1}\n";
  auto dry = RunCommand({Binary("conveyor"), "train", job, "--reference", "--set", "steps=2", "--set",
                         "optimizer.lr=0.05", "--dry-run"});
  ASSERT_EQ(dry.exit_code, 0) << dry.err;
  EXPECT_THAT(dry.out, HasSubstr("steps: 2"));
  EXPECT_THAT(dry.out, HasSubstr("lr: 0.05"));
  EXPECT_THAT(dry.out, ::testing::Not(HasSubstr("loss")));  // nothing ran
  auto run = RunCommand({Binary("conveyor"), "train", job, "--reference", "--set", "steps=2", "--json"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_THAT(run.out, HasSubstr("\"total_steps\":2"));
  auto typo = RunCommand({Binary("conveyor"), "train", job, "--reference", "--set", "optimizer.lrr=0.1"});
  EXPECT_NE(typo.exit_code, 0);
  EXPECT_THAT(typo.err, HasSubstr("did you mean optimizer.lr?"));
  auto bad = RunCommand({Binary("conveyor"), "submit", job, "--set", "batch_size=-3", "--dry-run"});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_THAT(bad.err, HasSubstr("with --set batch_size=-3"));
  EXPECT_THAT(bad.err, HasSubstr("batch_size"));
}

// A relative path in a submitted job is taken under the coordinator's first
// data root, not the job file's folder: the refusal says so, names the root,
// and (the CLI knows the job file's folder) where the path leads on this host.
TEST(Cli, ARelativePathTheCoordinatorCannotFindIsExplained) {
  const std::string root = testing::MakeTempDir("coordinator-root");
  const std::string here = testing::MakeTempDir("job-folder");
  std::filesystem::create_directories(here + "/data");
  std::ofstream(here + "/data/train.pt") << "not read: the coordinator never finds it";
  std::ofstream(here + "/job.yaml") << "model: toy\nbatch_size: 8\ndata: {format: tensors, train: data/train.pt}\n";
  cli::LocalClusterOptions options;
  options.remove_run_dir = true;
  options.stages = 1;
  options.bin_dir = CONVEYOR_BIN_DIR;
  options.data_roots = {root};
  auto cluster = cli::LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto r = RunCommand({Binary("conveyor"), "--coordinator", (*cluster)->coordinator_address(), "submit",
                       here + "/job.yaml"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("data.train: " + root + "/data/train.pt does not exist"));
  EXPECT_THAT(r.err, HasSubstr("data/train.pt is relative: it is taken under the first data root, " + root));
  EXPECT_THAT(r.err, HasSubstr("on this host it is "));
  EXPECT_THAT(r.err, HasSubstr("/data/train.pt, next to the job file"));
  // That file is outside the coordinator's roots: --set alone would be
  // refused (PERMISSION_DENIED), and the hint says what makes it readable.
  EXPECT_THAT(r.err, HasSubstr("outside the coordinator's data roots, so it would refuse that path; copy the file under "
                               "one of them, or start the coordinator with --data-root "));
  // A job file under the coordinator's root: --set names the file for it.
  const std::string inside = root + "/jobs";
  std::filesystem::create_directories(inside + "/data");
  std::ofstream(inside + "/data/train.pt") << "not read either";
  std::ofstream(inside + "/job.yaml") << "model: toy\nbatch_size: 8\ndata: {format: tensors, train: data/train.pt}\n";
  r = RunCommand({Binary("conveyor"), "--coordinator", (*cluster)->coordinator_address(), "submit", inside + "/job.yaml"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("--set data.train=" + std::filesystem::canonical(inside).string() +
                               "/data/train.pt names it"))
      << r.err;
  EXPECT_THAT(r.err, ::testing::Not(HasSubstr("outside the coordinator's data roots"))) << r.err;
  RemoveTree(root);
  RemoveTree(here);
}

}  // namespace
}  // namespace conveyor
