// Prometheus metrics against a real Prometheus (issue 21): Debian's
// `prometheus` scrapes a local cluster (coordinator and stage servers, each
// with --metrics-listen on a free port) during a job, and its HTTP API must
// hold the series and a step counter that rose. The training curves through
// the CLI: `status --metrics-csv`, `plot` and `local --curves`.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "common/files.h"
#include "common/net.h"
#include "conveyor.grpc.pb.h"
#include "tests/support/http.h"
#include "tests/support/test_util.h"

namespace conveyor::testing {
namespace {

using Clock = std::chrono::steady_clock;
using ::testing::HasSubstr;
constexpr auto kPoll = std::chrono::milliseconds(100);  // between questions to a server; never a wait for an outcome

std::string FindPrometheus() {
  for (const char* p : {"/usr/bin/prometheus", "/usr/local/bin/prometheus"})
    if (access(p, X_OK) == 0) return p;
  return "";
}

// A port free on loopback now (bound, read back, released).
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
    port = ntohs(addr.sin_port);
  close(fd);
  return port;
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A prometheus server scraping `coordinator` and `stages` every 200 ms,
// stopped (SIGTERM) when destroyed.
class PrometheusServer {
 public:
  PrometheusServer(const std::string& binary, const std::string& coordinator, const std::vector<std::string>& stages) {
    dir_ = MakeTempDir("prometheus");
    std::ostringstream config;
    config << "global: {scrape_interval: 200ms, scrape_timeout: 150ms}\n"
           << "scrape_configs:\n"
           << "  - job_name: conveyor-coordinator\n"
           << "    static_configs: [{targets: ['" << coordinator << "']}]\n"
           << "  - job_name: conveyor-stages\n"
           << "    static_configs: [{targets: [";
    for (std::size_t i = 0; i < stages.size(); ++i) config << (i ? ", " : "") << "'" << stages[i] << "'";
    config << "]}]\n";
    EXPECT_TRUE(WriteFileAtomically(dir_ + "/prometheus.yml", config.str()).ok());
    address_ = "127.0.0.1:" + std::to_string(FreePort());
    const std::vector<std::string> argv = {binary,
                                           "--config.file=" + dir_ + "/prometheus.yml",
                                           "--storage.tsdb.path=" + dir_ + "/data",
                                           "--web.listen-address=" + address_,
                                           "--log.level=warn"};
    pid_ = fork();
    if (pid_ == 0) {
      const std::string log = dir_ + "/prometheus.log";
      FILE* out = std::freopen(log.c_str(), "w", stderr);
      (void)out;
      std::vector<char*> cargv;
      for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
      cargv.push_back(nullptr);
      execv(cargv[0], cargv.data());
      _exit(127);
    }
  }
  ~PrometheusServer() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      waitpid(pid_, nullptr, 0);
    }
    RemoveTree(dir_);
  }
  const std::string& address() const { return address_; }
  std::string log() const { return ReadText(dir_ + "/prometheus.log"); }
  bool Exited() {
    int status = 0;
    return waitpid(pid_, &status, WNOHANG) == pid_ && (pid_ = -1, true);
  }

  // The result vector of an instant query (empty when the API cannot answer).
  nlohmann::json Query(const std::string& promql) {
    auto reply = HttpGet(address_, "/api/v1/query?query=" + UrlEncode(promql));
    if (!reply || reply->code != 200) return nlohmann::json::array();
    auto body = nlohmann::json::parse(reply->body, nullptr, false);
    if (body.is_discarded() || body.value("status", "") != "success") return nlohmann::json::array();
    return body["data"]["result"];
  }

 private:
  std::string dir_, address_;
  pid_t pid_ = -1;
};

double Value(const nlohmann::json& sample) { return std::stod(sample["value"][1].get<std::string>()); }

std::string JobYaml(const std::string& name, int stages, int64_t steps, bool eval) {
  std::ostringstream out;
  out << "name: " << name << "\nmodel: {name: toy}\npartition: {stages: " << stages
      << "}\ndata: {name: synthetic, train_samples: 512, test_samples: 64}\nbatch_size: 32\nsplit_size: 8\n"
      << "schedule: 1f1b\noptimizer: {name: sgd, lr: 0.05}\nloss: mse\nsteps: " << steps
      << "\neval: " << (eval ? "true" : "false") << "\nseed: 1\n";
  return out.str();
}

// JobYaml's job as DIR/NAME.yaml.
std::string JobFile(const std::string& dir, const std::string& name, int stages, int64_t steps, bool eval) {
  const std::string path = dir + "/" + name + ".yaml";
  std::ofstream(path) << JobYaml(name, stages, steps, eval);
  return path;
}

// `stages` stage servers and a coordinator, each serving /metrics on a free
// port; FAILED_PRECONDITION in a build without prometheus-cpp.
StatusOr<std::unique_ptr<cli::LocalCluster>> MetricsCluster(int stages) {
  cli::LocalClusterOptions options;
  options.remove_run_dir = true;
  options.stages = stages;
  options.bin_dir = CONVEYOR_BIN_DIR;
  options.metrics = true;
  return cli::LocalCluster::Start(options);
}

TEST(Prometheus, ScrapesTheClusterDuringAJob) {
  const std::string binary = FindPrometheus();
  if (binary.empty()) GTEST_SKIP() << "no prometheus binary (apt-get install prometheus; scripts/setup.sh does)";
  auto cluster = MetricsCluster(2);
  if (!cluster.ok() && absl::IsFailedPrecondition(cluster.status()))
    GTEST_SKIP() << "built without prometheus-cpp: " << cluster.status();
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const auto& metrics = (*cluster)->metrics_addresses();
  ASSERT_EQ(metrics.size(), 3u);
  const std::string coordinator = (*cluster)->coordinator_address();
  // Long enough to be scraped many times; cancelled once seen.
  const std::string job_id = Submit(coordinator, JobYaml("scraped", 2, 1000000, false));

  PrometheusServer prometheus(binary, metrics[2], {metrics[0], metrics[1]});
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  double first = -1, later = -1;
  while (Clock::now() < deadline && !prometheus.Exited()) {
    auto steps = prometheus.Query("conveyor_steps_total{job_id=\"" + job_id + "\"}");
    if (steps.size() == 1) {
      const double v = Value(steps[0]);
      if (first < 0) first = v;
      if (v > first) {
        later = v;
        break;
      }
    }
    std::this_thread::sleep_for(kPoll);
  }
  ASSERT_GT(later, first) << "the step counter did not rise in Prometheus within 60 s (first " << first
                          << "); its log:\n" << prometheus.log();
  std::cout << "[ scraped  ] conveyor_steps_total{job_id=\"" << job_id << "\"} went from " << first << " to "
            << later << "\n";

  // Every target is up, and the series of the coordinator and of each stage
  // are there with their labels.
  auto up = prometheus.Query("up == 1");
  EXPECT_EQ(up.size(), 3u) << up.dump();
  const std::string j = "{job_id=\"" + job_id + "\"}";
  for (const std::string& q :
       {std::string("conveyor_jobs{state=\"running\"} == 1"), "conveyor_loss" + j, "conveyor_learning_rate" + j,
        "conveyor_samples_per_second" + j, "conveyor_step_seconds_count" + j}) {
    auto r = prometheus.Query(q);
    EXPECT_EQ(r.size(), 1u) << q << ": " << r.dump();
    if (!r.empty()) std::cout << "[ scraped  ] " << q << " = " << Value(r[0]) << "\n";
  }
  for (const std::string& name :
       {"conveyor_stage_steps_total", "conveyor_stage_busy_seconds_total", "conveyor_stage_idle_seconds_total",
        "conveyor_stage_activation_peak_bytes"}) {
    auto r = prometheus.Query(name + j);
    ASSERT_EQ(r.size(), 2u) << name << ": " << r.dump();  // one per stage
    for (const auto& s : r) {
      EXPECT_EQ(s["metric"]["replica"], "0");
      EXPECT_EQ(s["metric"]["job"], "conveyor-stages");  // Prometheus's own target label
      std::cout << "[ scraped  ] " << name << "{stage=" << s["metric"]["stage"] << "} = " << Value(s) << "\n";
    }
  }
  // Stage 0 sends activations down and receives gradients up; stage 1 the reverse.
  auto sent = prometheus.Query("conveyor_stage_sent_bytes_total" + j);
  auto received = prometheus.Query("conveyor_stage_received_bytes_total" + j);
  ASSERT_EQ(sent.size(), 2u) << sent.dump();
  ASSERT_EQ(received.size(), 2u) << received.dump();
  for (const auto& s : sent) {
    EXPECT_EQ(s["metric"]["transport"], "grpc");
    EXPECT_EQ(s["metric"]["peer"], s["metric"]["stage"] == "0" ? "downstream" : "upstream");
    EXPECT_GT(Value(s), 0);
  }
  auto memory = prometheus.Query("conveyor_stage_device_memory_bytes{device=\"cpu\"} > 0");
  EXPECT_EQ(memory.size(), 2u) << memory.dump();
  auto r = RunCommand({Binary("conveyor"), "--coordinator", coordinator, "cancel", job_id});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(Follow(coordinator, job_id).state(), v1::JOB_STATE_CANCELLED);
}

// A server serves its series from its start, before any job (Prometheus'
// guidelines): conveyor_up and conveyor_build_info on both, and a stage
// server's memory in use with empty stage and replica labels. Before, an
// idle stage server's /metrics was empty.
TEST(Prometheus, IdleServersServeUpBuildInfoAndMemory) {
  auto cluster = MetricsCluster(1);
  if (!cluster.ok() && absl::IsFailedPrecondition(cluster.status()))
    GTEST_SKIP() << "built without prometheus-cpp: " << cluster.status();
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const auto& metrics = (*cluster)->metrics_addresses();
  ASSERT_EQ(metrics.size(), 2u);  // the stage server's, then the coordinator's
  auto stage = HttpGet(metrics[0], "/metrics");
  ASSERT_TRUE(stage.has_value());
  EXPECT_THAT(stage->body, HasSubstr("conveyor_up{role=\"stage\"} 1"));
  EXPECT_THAT(stage->body, HasSubstr("conveyor_build_info{role=\"stage\",version=\""));
  EXPECT_THAT(stage->body, HasSubstr("conveyor_stage_device_memory_bytes{device=\"cpu\",replica=\"\",stage=\"\"}"));
  auto coordinator = HttpGet(metrics[1], "/metrics");
  ASSERT_TRUE(coordinator.has_value());
  EXPECT_THAT(coordinator->body, HasSubstr("conveyor_up{role=\"coordinator\"} 1"));
}

TEST(Curves, StatusWritesTheCsvAndPlotThePng) {
  auto cluster = StartCluster(1);
  ASSERT_NE(cluster, nullptr);
  const std::string coordinator = cluster->coordinator_address();
  const v1::JobStatus done = SubmitAndWait(coordinator, JobYaml("curves", 1, 20, true));
  ASSERT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.error();

  const ScopedTempDir folder("curves");
  const std::string& dir = folder.path();
  const std::string csv = dir + "/curves.csv", png = dir + "/curves.png";
  auto r = RunCommand({Binary("conveyor"), "--coordinator", coordinator, "status", done.job_id(), "--metrics-csv", csv});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("20 training steps, 1 evaluation"), std::string::npos) << r.err;
  std::istringstream rows(ReadText(csv));
  std::string line;
  std::getline(rows, line);
  EXPECT_EQ(line,
            "kind,step,loss,lr,grad_norm,step_seconds,samples_per_second,tokens_per_second,eval_accuracy,"
            "eval_perplexity,unix_ms");
  int64_t step = 0;
  while (std::getline(rows, line) && line.rfind("train,", 0) == 0) {
    ++step;
    std::vector<std::string> cells;
    std::stringstream split(line);
    for (std::string cell; std::getline(split, cell, ',');) cells.push_back(cell);
    ASSERT_GE(cells.size(), 8u) << line;
    EXPECT_EQ(cells[1], std::to_string(step)) << line;
    EXPECT_FLOAT_EQ(std::stof(cells[2]), done.losses(static_cast<int>(step - 1))) << line;  // the status's loss
    EXPECT_EQ(cells[3], "0.05") << line;
    // Every step's global gradient norm, as the status has it (it was left empty).
    ASSERT_NE(cells[4], "") << line;
    EXPECT_NEAR(std::stod(cells[4]), done.grad_norms(static_cast<int>(step - 1)),
                1e-6 * done.grad_norms(static_cast<int>(step - 1))) << line;
    EXPECT_GT(std::stod(cells[6]), 0) << line;
  }
  EXPECT_EQ(step, 20);
  EXPECT_EQ(line.rfind("eval,20,", 0), 0u) << line;
  EXPECT_FALSE(std::getline(rows, line)) << "a row too many: " << line;

  r = RunCommand({Binary("conveyor"), "--coordinator", coordinator, "plot", done.job_id(), "--out", png});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("wrote " + png), std::string::npos) << r.out;
  EXPECT_EQ(ReadText(png).substr(0, 8), "\x89PNG\r\n\x1a\n");

  r = RunCommand({Binary("conveyor"), "--coordinator", coordinator, "plot", "job-404", "--out", png});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("job-404"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("NOT_FOUND"), std::string::npos) << r.err;
}

TEST(Curves, LocalDrawsThemAtTheEnd) {
  const ScopedTempDir folder("local-curves");
  const std::string png = folder.path() + "/local.png";
  auto r = RunCommand({Binary("conveyor"), "local", JobFile(folder.path(), "local-curves", 1, 10, false), "--device",
                       "cpu", "--curves", png});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("wrote " + png + ": the curves of job-1 (10 steps, 0 evaluations)"), std::string::npos)
      << r.err;
  EXPECT_EQ(ReadText(png).substr(0, 8), "\x89PNG\r\n\x1a\n");
}

}  // namespace
}  // namespace conveyor::testing
