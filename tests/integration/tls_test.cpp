// Authenticated channels as real processes on loopback: a coordinator and two
// stage servers over mutual TLS with a token, certificates made at test time
// by scripts/make-certs.sh. Clients without the certificate or the token are
// refused; a partial set of TLS flags is a usage error.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "cli/local_cluster.h"
#include "common/net.h"
#include "common/security.h"
#include "conveyor.grpc.pb.h"
#include "health.grpc.pb.h"
#include "tests/support/test_util.h"
#include "common/files.h"

namespace conveyor {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::Binary;
using testing::RunCommand;

constexpr char kToken[] = "tls-test-token-7d1e";
constexpr char kToyJob[] = "model: toy\npartition: {stages: 2}\nbatch_size: 8\nmicro_batches: 2\nsteps: 3\n";

std::optional<TlsOptions> Load(const TlsFiles& files) {
  auto tls = LoadTls(files);
  EXPECT_TRUE(tls.ok()) << tls.status();
  return tls.ok() ? *tls : std::nullopt;
}

// The standard health check, as a client secured by `tls`.
grpc::Status Health(const std::string& address, const std::optional<TlsOptions>& tls) {
  auto stub = grpc::health::v1::Health::NewStub(MakeChannel(address, tls));
  grpc::health::v1::HealthCheckRequest req;
  grpc::health::v1::HealthCheckResponse reply;
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineAfter(30));
  return stub->Check(&ctx, req, &reply);
}

class Tls : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = testing::MakeTempDir("tls");
    const std::string& dir = dir_;
    node_ = testing::MakeCertificate(dir, "node", {"localhost", "127.0.0.1"});
    cli_ = testing::MakeCertificate(dir, "cli");
    stranger_ = testing::MakeCertificate(dir + "/other-ca", "node", {"localhost", "127.0.0.1"});
    token_file_ = dir + "/token";
    std::ofstream(token_file_) << kToken << "\n";
    job_file_ = dir + "/toy.yaml";
    std::ofstream(job_file_) << kToyJob;

    cli::LocalClusterOptions options;
    options.stages = 2;
    options.bin_dir = CONVEYOR_BIN_DIR;
    options.tls = node_;
    options.auth_token = kToken;
    auto cluster = cli::LocalCluster::Start(options);
    EXPECT_TRUE(cluster.ok()) << cluster.status();
    if (cluster.ok()) cluster_ = cluster->release();
  }
  static void TearDownTestSuite() {
    if (cluster_) {
      cluster_->Stop();
      RemoveTree(cluster_->run_dir());  // logs, state, and a copy of the token
    }
    delete cluster_;
    cluster_ = nullptr;
    RemoveTree(dir_);
  }
  void SetUp() override { ASSERT_TRUE(cluster_); }

  static grpc::Status Submit(const std::optional<TlsOptions>& tls, const std::string& token, std::string* job_id) {
    auto stub = v1::Coordinator::NewStub(MakeChannel(cluster_->coordinator_address(), tls));
    v1::SubmitJobRequest req;
    req.set_job_yaml(kToyJob);
    v1::SubmitJobReply reply;
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineAfter(30));
    AddBearerToken(&ctx, token);
    grpc::Status st = stub->SubmitJob(&ctx, req, &reply);
    if (job_id) *job_id = reply.job_id();
    return st;
  }

  // The conveyor CLI against the cluster's coordinator, with `args` after it.
  static testing::CommandResult Conveyor(std::vector<std::string> args) {
    args.insert(args.begin(), {Binary("conveyor"), "--coordinator", cluster_->coordinator_address()});
    return RunCommand(args);
  }
  static std::vector<std::string> TlsFlags(const TlsFiles& f) {
    return {"--tls-cert", f.cert, "--tls-key", f.key, "--tls-ca", f.ca};
  }

  static cli::LocalCluster* cluster_;
  static TlsFiles node_, cli_, stranger_;
  static std::string dir_, token_file_, job_file_;
};

cli::LocalCluster* Tls::cluster_ = nullptr;
TlsFiles Tls::node_, Tls::cli_, Tls::stranger_;
std::string Tls::dir_, Tls::token_file_, Tls::job_file_;

TEST_F(Tls, AJobRunsEndToEndOverMutualTls) {
  const auto client = Load(cli_);
  std::string id;
  grpc::Status st = Submit(client, kToken, &id);
  ASSERT_TRUE(st.ok()) << st.error_message();
  auto stub = v1::Coordinator::NewStub(MakeChannel(cluster_->coordinator_address(), client));
  v1::GetJobRequest get;
  get.set_job_id(id);
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineAfter(120));
  auto reader = stub->WatchJob(&ctx, get);  // read-only: no token needed
  v1::JobStatus status;
  while (reader->Read(&status)) {
  }
  ASSERT_TRUE(reader->Finish().ok());
  // Two stages that refuse anything but mutual TLS trained the job, passing
  // tensors to each other: every link was authenticated.
  EXPECT_EQ(status.state(), v1::JOB_STATE_SUCCEEDED) << status.error();
  EXPECT_EQ(status.losses_size(), 3);
  ASSERT_EQ(status.stages_size(), 2);
  EXPECT_EQ(status.stages(0).transport(), v1::LINK_GRPC);
}

TEST_F(Tls, ClientsWithoutTheRightCertificateAreRefused) {
  const auto trusted = Load(cli_);
  ASSERT_TRUE(trusted);
  TlsOptions no_certificate;  // trusts the servers, presents nothing
  no_certificate.ca_pem = trusted->ca_pem;
  std::optional<TlsOptions> other_ca = Load(stranger_);  // a certificate the servers' CA did not sign
  ASSERT_TRUE(other_ca);
  other_ca->ca_pem = trusted->ca_pem;
  std::optional<TlsOptions> trusts_other_ca = trusted;  // cannot verify the servers
  trusts_other_ca->ca_pem = Load(stranger_)->ca_pem;

  std::vector<std::string> servers = cluster_->stage_addresses();
  servers.push_back(cluster_->coordinator_address());
  for (const std::string& address : servers) {
    grpc::Status st = Health(address, trusted);
    EXPECT_TRUE(st.ok()) << address << ": " << st.error_message();
    for (const auto& [what, tls] : {std::pair<const char*, std::optional<TlsOptions>>{"plaintext", std::nullopt},
                                    {"no client certificate", no_certificate},
                                    {"a certificate from another CA", other_ca},
                                    {"a client that trusts another CA", trusts_other_ca}}) {
      EXPECT_EQ(Health(address, tls).error_code(), grpc::StatusCode::UNAVAILABLE) << address << ": " << what;
    }
  }
}

TEST_F(Tls, SubmitAndCancelNeedTheToken) {
  const auto client = Load(cli_);
  grpc::Status st = Submit(client, "", nullptr);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(st.error_message(), HasSubstr("this coordinator requires a token"));
  st = Submit(client, "tls-test-token-7d1f", nullptr);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(st.error_message(), Not(HasSubstr("7d1"))) << "names neither the token sent nor the right one";

  auto stub = v1::Coordinator::NewStub(MakeChannel(cluster_->coordinator_address(), client));
  v1::JobRef ref;
  ref.set_job_id("job-424242");
  v1::JobStatus status;
  grpc::ClientContext no_token;
  EXPECT_EQ(stub->CancelJob(&no_token, ref, &status).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  grpc::ClientContext with_token;
  AddBearerToken(&with_token, kToken);
  EXPECT_EQ(stub->CancelJob(&with_token, ref, &status).error_code(), grpc::StatusCode::NOT_FOUND)
      << "past the token check, the job is unknown";
  grpc::ClientContext read_only;
  v1::ListJobsReply jobs;
  EXPECT_TRUE(stub->ListJobs(&read_only, v1::ListJobsRequest(), &jobs).ok()) << "read-only calls stay open";
  // The right token submits: AJobRunsEndToEndOverMutualTls.
}

TEST_F(Tls, TheCliUsesCertificatesAndTokenFromFlagsOrEnvironment) {
  auto r = Conveyor({"list"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("UNAVAILABLE"));

  std::vector<std::string> args = TlsFlags(cli_);
  args.insert(args.begin(), {"submit", job_file_});
  r = Conveyor(args);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, AllOf(HasSubstr("requires a token"), HasSubstr("UNAUTHENTICATED")));

  args.insert(args.end(), {"--token-file", token_file_, "--wait", "--json"});
  r = Conveyor(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["state"], "succeeded");

  // The same from the environment; the child inherits it.
  const std::pair<const char*, std::string> env[] = {
      {"CONVEYOR_TLS_CERT", cli_.cert}, {"CONVEYOR_TLS_KEY", cli_.key}, {"CONVEYOR_TLS_CA", cli_.ca},
      {"CONVEYOR_TOKEN", kToken}};
  for (const auto& [k, v] : env) setenv(k, v.c_str(), 1);
  r = Conveyor({"cancel", "job-424242"});
  for (const auto& [k, v] : env) unsetenv(k);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("NOT_FOUND")) << "past TLS and the token, the job is unknown";
}

// `conveyor local` with certificates and a token runs its whole cluster over
// mutual TLS.
TEST_F(Tls, LocalRunsItsClusterOverMutualTls) {
  std::vector<std::string> args = {Binary("conveyor"), "local", job_file_, "--device", "cpu", "--json",
                                   "--curves", "", "--token-file", token_file_};
  for (const std::string& a : TlsFlags(node_)) args.push_back(a);
  auto r = RunCommand(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["state"], "succeeded");
}

TEST(TlsFlags, APartialSetOrABadFileIsAUsageError) {
  const std::string dir = testing::MakeTempDir("tls-flags");
  const std::vector<std::vector<std::string>> programs = {
      {Binary("stage_server")},
      {Binary("coordinator"), "--stages", "127.0.0.1:1", "--state-dir", dir},
      {Binary("conveyor"), "list"}};
  for (auto argv : programs) {
    argv.insert(argv.end(), {"--tls-cert", dir + "/node.crt"});
    auto r = RunCommand(argv);
    EXPECT_EQ(r.exit_code, 2) << argv[0];
    EXPECT_THAT(r.err, HasSubstr("missing --tls-key and --tls-ca")) << argv[0];
  }
  auto r = RunCommand({Binary("stage_server"), "--tls-cert", dir + "/node.crt", "--tls-key", dir + "/node.key",
                       "--tls-ca", dir + "/ca.crt"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("cannot read --tls-cert " + dir + "/node.crt"));
  const std::string empty = dir + "/empty-token";
  std::ofstream(empty) << "\n";
  r = RunCommand({Binary("coordinator"), "--stages", "127.0.0.1:1", "--state-dir", dir, "--auth-token-file", empty});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr(empty + " holds no token"));
  RemoveTree(dir);
}

}  // namespace
}  // namespace conveyor
