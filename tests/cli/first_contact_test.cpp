// What a new user hits first, as real processes: a port or a folder already
// in use, usage errors, job files that are not job files, stages that do not
// answer, and what the CLI says about jobs (issue 15).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <set>

#include "cli/local_cluster.h"
#include "cli/output.h"
#include "common/server.h"
#include "coordinator/coordinator.h"
#include "coordinator/coordinator_service.h"
#include "tests/support/test_util.h"

namespace conveyor {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::Binary;
using testing::RunCommand;

using testing::StartCluster;

std::string WriteFile(const std::string& dir, const std::string& name, const std::string& content) {
  const std::string path = dir + "/" + name;
  std::ofstream(path, std::ios::binary) << content;
  return path;
}

TEST(FirstContact, APortInUseIsRefused) {
  const testing::ScopedTempDir second("second-coordinator");
  auto cluster = StartCluster(1);
  ASSERT_TRUE(cluster);
  const std::string stage = cluster->stage_addresses()[0];
  auto r = RunCommand({Binary("stage_server"), "--listen", stage});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("cannot listen on " + stage + ": address already in use"));
  r = RunCommand({Binary("coordinator"), "--listen", cluster->coordinator_address(), "--stages", stage,
                  "--state-dir", second.path()});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("address already in use"));
  // The clear message alone, without gRPC's own dump of the failed bind.
  for (const char* raw : {"chttp2_server", "server_builder", "No address added"})
    EXPECT_THAT(r.err, Not(HasSubstr(raw))) << r.err;
  // The first servers go on serving alone.
  r = RunCommand({Binary("conveyor"), "health", stage});
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST(FirstContact, AFolderInUseIsRefusedNamingItsHolder) {
  auto cluster = StartCluster(1);
  ASSERT_TRUE(cluster);
  const std::string state = cluster->run_dir() + "/state";
  auto r = RunCommand({Binary("coordinator"), "--listen", "127.0.0.1:0", "--stages", cluster->stage_addresses()[0],
                       "--state-dir", state});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("state folder " + state + " is in use by another process (pid "));
  const std::string checkpoints = cluster->run_dir() + "/stage-0/checkpoints";
  r = RunCommand({Binary("stage_server"), "--listen", "127.0.0.1:0", "--checkpoint-dir", checkpoints});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("checkpoint folder " + checkpoints + " is in use by another process"));
}

TEST(FirstContact, UsageErrorsExitWithTwoAndSayWhat) {
  auto r = RunCommand({Binary("conveyor")});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("no command given (one of: submit, status, list, cancel, resume, train, local, trace, health"));
  r = RunCommand({Binary("conveyor"), "frobnicate"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("unknown command 'frobnicate'"));
  r = RunCommand({Binary("conveyor"), "--coordinator", "127.0.0.1:1", "frobnicate"});
  EXPECT_THAT(r.err, HasSubstr("unknown command 'frobnicate'"));
  r = RunCommand({Binary("conveyor"), "--coordinator", "127.0.0.1", "list"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--coordinator: '127.0.0.1' has no port"));
  r = RunCommand({Binary("conveyor"), "health", "garbage"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("'garbage' has no port"));
  r = RunCommand({Binary("conveyor"), "status"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("status: job_id is required"));
  r = RunCommand({Binary("conveyor"), "trace", "job-1", "--step", "0"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("steps count from 1"));
  for (const char* program : {"stage_server", "coordinator", "conveyor"}) {
    r = RunCommand({Binary(program), "--no-such-flag"});
    EXPECT_EQ(r.exit_code, 2) << program;
    EXPECT_THAT(r.err, HasSubstr("--no-such-flag")) << program;
  }
  r = RunCommand({Binary("coordinator"), "--stages", "127.0.0.1", "--state-dir", "/tmp/x"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--stages: '127.0.0.1' has no port"));
  r = RunCommand({Binary("stage_server"), "--listen", "localhost"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--listen: 'localhost' has no port"));
  // Mistakes on the command line about a job, whatever the job file holds.
  const testing::ScopedTempDir folder("usage");
  const std::string job = WriteFile(folder.path(), "job.yaml", "model: toy\nsteps: 2\n");
  struct Case {
    std::vector<std::string> args;
    std::string says;
  };
  for (const Case& c : std::vector<Case>{
           {{"train", job}, "train: `conveyor train` runs the single-process reference: add --reference"},
           {{"train", job, "--reference", "--device", "gpu"}, "expected cpu, cuda or cuda:N, got 'gpu'"},
           {{"train", job, "--reference", "--threads=-1"}, "--threads: must be 0 or more, got -1"},
           {{"local", job, "--device", "gpu"}, "--device"},
           {{"local", job, "--stages=-2"}, "--stages: must be 0 or more, got -2"},
           {{"local", job, "--set", "optimizer.lrr=0.1"}, "unknown key optimizer.lrr (did you mean optimizer.lr?"},
           {{"--coordinator", "127.0.0.1:1", "submit", job, "--set", "steps"}, "--set 'steps': expected KEY=VALUE"},
       }) {
    std::vector<std::string> argv = {Binary("conveyor")};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    r = RunCommand(argv);
    EXPECT_EQ(r.exit_code, 2) << c.says << ": " << r.err;
    EXPECT_THAT(r.err, HasSubstr(c.says));
    EXPECT_THAT(r.err, HasSubstr("--help"));
  }
}

TEST(FirstContact, PeersThatAreNotThereAreSaidInWords) {
  auto r = RunCommand({Binary("conveyor"), "health", "garbage.invalid:1"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("cannot reach the server at garbage.invalid:1: host not found"));
  EXPECT_THAT(r.err, Not(HasSubstr("C-ares")));
  r = RunCommand({Binary("conveyor"), "--coordinator", "127.0.0.1:1", "list"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("cannot reach the coordinator at 127.0.0.1:1: connection refused"));
  r = RunCommand({Binary("conveyor"), "health", "127.0.0.1:1", "--wait", "0.5"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("no answer within"));
}

TEST(FirstContact, JobFilesThatAreNotJobFilesAreNamed) {
  const testing::ScopedTempDir folder("first-contact");
  std::string binary;
  for (int i = 0; i < 256; ++i) binary.push_back(static_cast<char>(255 - i));
  const std::string bin = WriteFile(folder.path(), "random.bin", binary);
  for (const char* command : {"submit", "local", "train"}) {
    std::vector<std::string> argv = {Binary("conveyor"), "--coordinator", "127.0.0.1:1", command, bin};
    if (std::string(command) == "train") argv.push_back("--reference");
    auto r = RunCommand(argv);
    EXPECT_EQ(r.exit_code, 1) << command;
    EXPECT_THAT(r.err, HasSubstr("random.bin: the job file is not text (YAML): byte 0 (0xff)")) << command;
    EXPECT_THAT(r.err, Not(HasSubstr("libprotobuf"))) << command;
    EXPECT_THAT(r.err, Not(HasSubstr("(INTERNAL)"))) << command;
  }
  auto r = RunCommand({Binary("conveyor"), "--coordinator", "127.0.0.1:1", "submit", ::testing::TempDir()});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("is a folder, not a job file"));
  r = RunCommand({Binary("conveyor"), "train", WriteFile(folder.path(), "quoted.yaml", "model: toy\nepochs: \"1\"\n"),
                  "--reference"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("epochs: expected an integer, got the string \"1\""));
}

// A coordinator over one live stage server and one address where nothing
// listens, served in this process.
class UnreachableStage : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster_ = StartCluster(1);
    ASSERT_TRUE(cluster_);
    CoordinatorOptions options;
    options.stages = {cluster_->stage_addresses()[0], "127.0.0.1:1"};
    auto c = Coordinator::Start(options);
    ASSERT_TRUE(c.ok()) << c.status();
    coordinator_ = std::move(*c);
    service_ = std::make_unique<CoordinatorService>(coordinator_.get(), "");
    auto server = GrpcServer::Start("127.0.0.1:0", {service_.get()});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
  }
  void TearDown() override {
    if (coordinator_) coordinator_->Shutdown();
    if (server_) server_->Shutdown();
  }

  std::unique_ptr<cli::LocalCluster> cluster_;
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<CoordinatorService> service_;
  std::unique_ptr<GrpcServer> server_;
};

TEST_F(UnreachableStage, HealthAndListNameIt) {
  auto r = RunCommand({Binary("conveyor"), "health", server_->address()});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("stage servers: 2, 1 answering"));
  EXPECT_THAT(r.out, HasSubstr("127.0.0.1:1"));
  EXPECT_THAT(r.out, HasSubstr("is unreachable: connection refused"));
  r = RunCommand({Binary("conveyor"), "--coordinator", server_->address(), "list"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("127.0.0.1:1"));
  EXPECT_THAT(r.out, HasSubstr("is unreachable: connection refused"));
}

TEST_F(UnreachableStage, AJobPlacedOnItFailsAtOnceWithUnavailableNamingIt) {
  // stage_timeout is an hour: a job that waited for the stage would hang the test.
  v1::JobStatus s = testing::SubmitAndWait(server_->address(), "model: toy\npartition: {stages: 2}\nstage_timeout: 3600\n");
  EXPECT_EQ(s.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(s.error_code(), "UNAVAILABLE");
  EXPECT_THAT(s.error(), HasSubstr("stage 1: 127.0.0.1:1 is unreachable: connection refused"));
  EXPECT_THAT(s.error(), Not(HasSubstr("stage 1: stage")));
}

TEST(FirstContact, AMissingDatasetIsRefusedAtSubmissionNamingThePathOnce) {
  const testing::ScopedTempDir folder("first-contact");
  auto cluster = StartCluster(1);
  ASSERT_TRUE(cluster);
  const std::string job = WriteFile(folder.path(), "no-data.yaml",
                                    "model: convnet\ndata: {name: fashion-mnist, path: /missing/fmnist}\n");
  auto r = RunCommand({Binary("conveyor"), "--coordinator", cluster->coordinator_address(), "submit", job});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("data.path: /missing/fmnist does not exist"));
  EXPECT_THAT(r.err, HasSubstr("(NOT_FOUND)"));
  r = RunCommand({Binary("conveyor"), "--coordinator", cluster->coordinator_address(), "list"});
  EXPECT_THAT(r.out, HasSubstr("no jobs"));  // nothing was queued
}

// Everything the CLI says about one job, from submission to its trace.
TEST(FirstContact, WhatTheCliSaysAboutJobs) {
  const testing::ScopedTempDir folder("first-contact");
  auto cluster = StartCluster(1);
  ASSERT_TRUE(cluster);
  const std::string coord = cluster->coordinator_address();
  const std::string job =
      WriteFile(folder.path(), "three-steps.yaml", "name: three\nmodel: toy\nsteps: 3\nmicro_batches: 1\n");
  auto r = RunCommand({Binary("conveyor"), "--coordinator", coord, "submit", job, "--wait", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto submitted = nlohmann::json::parse(r.out);
  const std::string id = submitted["job_id"];
  // The last progress line once; no plural for one.
  std::size_t lines = 0;
  for (std::size_t at = r.err.find("step 3/3"); at != std::string::npos; at = r.err.find("step 3/3", at + 1)) ++lines;
  EXPECT_EQ(lines, 1u) << r.err;  // the progress line (the summary says "steps 3/3")
  EXPECT_THAT(r.err, HasSubstr("(1 epoch)"));
  EXPECT_THAT(r.err, HasSubstr("in 1 micro-batch,"));

  // Every --json object of a job has the same keys, whatever the command.
  r = RunCommand({Binary("conveyor"), "--coordinator", coord, "status", id, "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto status = nlohmann::json::parse(r.out);
  r = RunCommand({Binary("conveyor"), "--coordinator", coord, "list", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto listed = nlohmann::json::parse(r.out).at(0);
  r = RunCommand({Binary("conveyor"), "train", job, "--reference", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto reference = nlohmann::json::parse(r.out);
  auto keys = [](const nlohmann::json& j) {
    std::set<std::string> k;
    for (auto it = j.begin(); it != j.end(); ++it) k.insert(it.key());
    return k;
  };
  EXPECT_EQ(keys(submitted), keys(status));
  EXPECT_EQ(keys(status), keys(listed));
  EXPECT_EQ(keys(status), keys(reference));
  EXPECT_EQ(listed["losses"], status["losses"]);
  EXPECT_EQ(listed["final_loss"], status["final_loss"]);
  EXPECT_FALSE(listed["final_loss"].is_null());

  // Traces count steps as progress does, and say so on stdout.
  const std::string prefix = folder.path() + "/t";
  r = RunCommand({Binary("conveyor"), "--coordinator", coord, "trace", id, "--out", prefix});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("step 3 of " + id));
  r = RunCommand({Binary("conveyor"), "--coordinator", coord, "trace", id, "--step", "1", "--out", prefix});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("step 1 of " + id));
  r = RunCommand({Binary("conveyor"), "--coordinator", coord, "trace", id, "--step", "2", "--out", prefix});
  EXPECT_EQ(r.exit_code, 0) << r.err;

  // A queued job shows no steps, and cancelling it says it is cancelled.
  const std::string endless =
      WriteFile(folder.path(), "endless.yaml", "name: endless\nmodel: toy\nsteps: 100000000\n");
  r = RunCommand({Binary("conveyor"), "--coordinator", coord, "submit", endless});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string running = r.out.substr(0, r.out.find('\n'));
  r = RunCommand({Binary("conveyor"), "--coordinator", coord, "submit", endless});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string queued = r.out.substr(0, r.out.find('\n'));
  r = RunCommand({Binary("conveyor"), "--coordinator", coord, "list"});
  const auto line = r.out.find(queued + " ");
  ASSERT_NE(line, std::string::npos) << r.out;
  EXPECT_THAT(r.out.substr(line, r.out.find('\n', line) - line), Not(HasSubstr("step")));
  r = RunCommand({Binary("conveyor"), "--coordinator", coord, "cancel", queued});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, queued + " cancelled\n");
  r = RunCommand({Binary("conveyor"), "--coordinator", coord, "cancel", running});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "cancelling " + running + ": it stops after its current step\n");
  EXPECT_EQ(testing::Follow(coord, running).state(), v1::JOB_STATE_CANCELLED);
}

// replicas: the summary shows the grid, replica x stage -> server.
TEST(FirstContact, AReplicatedJobShowsItsGrid) {
  v1::JobStatus s;
  s.set_job_id("job-1");
  s.set_state(v1::JOB_STATE_RUNNING);
  s.set_micro_batches(1);
  for (int i = 0; i < 4; ++i) {
    v1::StageReport* r = s.add_stages();
    r->set_replica(i / 2);
    r->set_index(i % 2);
    r->set_address("10.0.0." + std::to_string(i) + ":7000");
    r->set_device("cpu");
  }
  const std::string text = cli::Summary(s);
  EXPECT_THAT(text, HasSubstr("  replica 0 stage 1 10.0.0.1:7000 layers"));
  EXPECT_THAT(text, HasSubstr("  replica 1 stage 0 10.0.0.2:7000 layers"));
  s.mutable_stages()->DeleteSubrange(2, 2);  // one pipeline: no replica column
  EXPECT_THAT(cli::Summary(s), HasSubstr("  stage 1 10.0.0.1:7000 layers"));
  EXPECT_THAT(cli::Summary(s), Not(HasSubstr("replica")));
}

TEST(FirstContact, ARunningJobHasALossNotAFinalLoss) {
  v1::JobStatus s;
  s.set_job_id("job-1");
  s.set_state(v1::JOB_STATE_RUNNING);
  s.set_step(5);
  s.set_total_steps(10);
  s.set_total_epochs(1);
  s.set_micro_batches(1);
  s.set_loss(0.5f);
  EXPECT_THAT(cli::Summary(s), HasSubstr("  loss 0.5000"));
  EXPECT_THAT(cli::Summary(s), Not(HasSubstr("final loss")));
  EXPECT_THAT(cli::Summary(s), HasSubstr("(1 epoch), batch 0 in 1 micro-batch,"));
  s.set_state(v1::JOB_STATE_SUCCEEDED);
  EXPECT_THAT(cli::Summary(s), HasSubstr("final loss 0.5000"));
  EXPECT_EQ(cli::Plural(2, "micro-batch"), "2 micro-batches");
  EXPECT_EQ(cli::Plural(1, "epoch"), "1 epoch");
  EXPECT_EQ(cli::Plural(3, "epoch"), "3 epochs");
  v1::JobStatus queued;
  queued.set_job_id("job-2");
  queued.set_state(v1::JOB_STATE_QUEUED);
  EXPECT_THAT(cli::ListLine(queued), Not(HasSubstr("step 0/0")));
}

// The summary gives the steady steps' median and slowest time: a rate far
// under what the median says comes from a few slow steps (start-up that
// outlasted the warm-up, a stall), not from every step.
TEST(FirstContact, TheSummaryGivesTheSteadyStepsMedianAndSlowest) {
  v1::JobStatus s;
  s.set_job_id("job-1");
  s.set_state(v1::JOB_STATE_SUCCEEDED);
  s.set_step(6);
  s.set_total_steps(6);
  s.set_steady_samples_per_second(1000);
  for (double t : {0.5, 0.4, 0.010, 0.012, 0.011, 0.050}) s.add_step_seconds(t);
  EXPECT_THAT(cli::Summary(s), HasSubstr("step time after the first 2 steps: median 12.00 ms, slowest 50.00 ms (step 6)"));
  s.mutable_step_seconds()->Truncate(4);  // too few steady steps to say
  EXPECT_THAT(cli::Summary(s), Not(HasSubstr("step time")));
}

// Perplexity is a language model's (its loss is per token): a classifier's
// summary and --json give none (it printed exp of a cross-entropy, once with
// 280 digits).
TEST(FirstContact, OnlyAJobThatCountsTokensHasAPerplexity) {
  v1::JobStatus s;
  s.set_job_id("job-1");
  s.set_state(v1::JOB_STATE_SUCCEEDED);
  s.set_has_eval(true);
  s.set_eval_accuracy(0.85);
  s.set_eval_loss(0.4);
  EXPECT_THAT(cli::Summary(s), HasSubstr("test accuracy 85.00%, test loss 0.4000\n"));
  EXPECT_THAT(cli::Summary(s), Not(HasSubstr("perplexity")));
  EXPECT_TRUE(cli::ToJson(s)["eval_perplexity"].is_null());
  s.set_tokens(true);
  EXPECT_THAT(cli::Summary(s), HasSubstr("test loss 0.4000 (perplexity 1.492)"));
  EXPECT_NEAR(cli::ToJson(s)["eval_perplexity"].get<double>(), std::exp(0.4), 1e-12);
}

}  // namespace
}  // namespace conveyor
