#include "tests/support/test_util.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>

#include "plan/job_spec.h"
#include "common/files.h"
#include "common/net.h"
#include "transport/tensor_codec.h"
#include "conveyor.grpc.pb.h"
#include "tests/support/in_process.h"

namespace conveyor::testing {

cli::ReferenceResult Reference(const std::string& yaml, const std::string& device) {
  auto spec = ParseJobYaml(yaml);
  EXPECT_TRUE(spec.ok()) << spec.status();
  cli::ReferenceOptions options;
  options.device = device;
  auto ref = cli::TrainReference(*spec, options);
  EXPECT_TRUE(ref.ok()) << ref.status();
  return ref.ok() ? std::move(*ref) : cli::ReferenceResult();
}

void ExpectMatchesReference(const v1::JobStatus& run, const std::vector<std::pair<std::string, at::Tensor>>& params,
                            const cli::ReferenceResult& ref) {
  ASSERT_EQ(run.state(), v1::JOB_STATE_SUCCEEDED) << run.error();
  ASSERT_EQ(run.losses_size(), ref.status.losses_size());
  for (int i = 0; i < run.losses_size(); ++i) {
    const double a = run.losses(i), b = ref.status.losses(i);
    EXPECT_LE(std::abs(a - b), kAtol + kRtol * std::abs(b)) << "loss of step " << i << ": " << a << " vs " << b;
  }
  ASSERT_EQ(params.size(), ref.parameters.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(params[i].first, ref.parameters[i].first);
    const at::Tensor& a = params[i].second;
    const at::Tensor& b = ref.parameters[i].second;
    ASSERT_EQ(a.sizes(), b.sizes()) << params[i].first;
    EXPECT_TRUE(at::allclose(a, b, kRtol, kAtol))
        << params[i].first << ": max difference " << (a - b).abs().max().item<double>();
  }
}

std::string Binary(const std::string& name) { return std::string(CONVEYOR_BIN_DIR) + "/" + name; }

CommandResult RunCommand(const std::vector<std::string>& argv) {
  CommandResult r;
  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) return r;
  pid_t pid = fork();
  if (pid == 0) {
    dup2(out[1], STDOUT_FILENO);
    dup2(err[1], STDERR_FILENO);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    _exit(127);
  }
  close(out[1]);
  close(err[1]);
  pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  int open_fds = 2;
  char buf[65536];
  while (open_fds > 0) {
    if (poll(fds, 2, -1) < 0) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP))) continue;
      ssize_t n = read(fds[i].fd, buf, sizeof buf);
      if (n <= 0) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      } else {
        (i == 0 ? r.out : r.err).append(buf, static_cast<std::size_t>(n));
      }
    }
  }
  int status = 0;
  waitpid(pid, &status, 0);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

std::unique_ptr<cli::LocalCluster> StartCluster(int stages) {
  cli::LocalClusterOptions options;
  options.remove_run_dir = true;
  options.stages = stages;
  options.bin_dir = CONVEYOR_BIN_DIR;
  auto cluster = cli::LocalCluster::Start(options);
  EXPECT_TRUE(cluster.ok()) << cluster.status();
  return cluster.ok() ? std::move(*cluster) : nullptr;
}

std::string MakeTempDir(const std::string& prefix) {
  std::string tmpl = ::testing::TempDir() + "/" + prefix + "-XXXXXX";
  EXPECT_NE(mkdtemp(tmpl.data()), nullptr) << tmpl;
  return tmpl;
}

ScopedTempDir::~ScopedTempDir() { RemoveTree(path_); }

TlsFiles MakeCertificate(const std::string& dir, const std::string& name, const std::vector<std::string>& hosts) {
  std::vector<std::string> argv = {"/bin/bash", std::string(CONVEYOR_SOURCE_DIR) + "/scripts/make-certs.sh", dir, name};
  argv.insert(argv.end(), hosts.begin(), hosts.end());
  CommandResult r = RunCommand(argv);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  TlsFiles files;
  files.cert = dir + "/" + name + ".crt";
  files.key = dir + "/" + name + ".key";
  files.ca = dir + "/ca.crt";
  return files;
}

bool HaveFashionMnist() {
  return std::filesystem::exists(std::string(kDefaultFashionMnistPath) + "/train-images-idx3-ubyte.gz");
}

std::string Submit(const std::string& coordinator, const std::string& yaml) {
  auto stub = v1::Coordinator::NewStub(MakeChannel(coordinator));
  v1::SubmitJobRequest req;
  req.set_job_yaml(yaml);
  v1::SubmitJobReply reply;
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineAfter(60));
  grpc::Status st = stub->SubmitJob(&ctx, req, &reply);
  EXPECT_TRUE(st.ok()) << st.error_message();
  return reply.job_id();
}

v1::JobStatus Follow(const std::string& coordinator, const std::string& job_id,
                     const std::function<void(const v1::JobStatus&)>& on_status) {
  v1::JobStatus status;
  const auto give_up = DeadlineAfter(300);
  while (!IsTerminal(status.state()) && std::chrono::system_clock::now() < give_up) {
    auto stub = v1::Coordinator::NewStub(MakeChannel(coordinator));
    v1::GetJobRequest get;
    get.set_job_id(job_id);
    get.set_omit_losses(true);
    grpc::ClientContext ctx;
    ctx.set_deadline(give_up);
    ctx.set_wait_for_ready(true);
    auto reader = stub->WatchJob(&ctx, get);
    v1::JobStatus s;
    while (reader->Read(&s)) {
      status = s;
      if (on_status) on_status(status);
    }
    reader->Finish();
  }
  auto stub = v1::Coordinator::NewStub(MakeChannel(coordinator));
  v1::GetJobRequest get;
  get.set_job_id(job_id);
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineAfter(30));
  ctx.set_wait_for_ready(true);
  EXPECT_TRUE(stub->GetJob(&ctx, get, &status).ok());
  return status;
}

std::vector<std::pair<std::string, at::Tensor>> ServerParameters(const std::vector<std::string>& stages,
                                                                 const std::string& job_id) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const std::string& address : stages) {
    auto stub = v1::StageControl::NewStub(MakeChannel(address));
    v1::JobRef ref;
    ref.set_job_id(job_id);
    v1::ParametersReply reply;
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineAfter(60));
    grpc::Status st = stub->GetParameters(&ctx, ref, &reply);
    EXPECT_TRUE(st.ok()) << address << ": " << st.error_message();
    for (auto& p : *reply.mutable_parameters()) out.emplace_back(p.name(), DecodeTensor(p.mutable_tensor()));
  }
  SortByLayer(&out);
  return out;
}

}  // namespace conveyor::testing
