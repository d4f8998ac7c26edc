// Stage servers as separate hosts: each in its own network namespace with its
// own address, joined to the coordinator's namespace by a veth pair on a
// bridge. Cutting one stage's link (no reset reaches anyone: packets just
// stop) is handled like a dead stage; bringing it back lets the job recover
// and end with the uninterrupted run's digest.
//
// Needs root (CI runs as root): elsewhere it skips and says why; as root it
// must run, and fails if the namespaces cannot be made.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include "cli/local_cluster.h"
#include "plan/job_spec.h"
#include "common/net.h"
#include "conveyor.grpc.pb.h"
#include "tests/support/test_util.h"

namespace conveyor {
namespace {

using ::testing::HasSubstr;

constexpr int kStages = 3;

class Hosts : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "network namespaces need root (CI runs as root); this user is not";
    const std::string tag = std::to_string(getpid() % 100000);
    bridge_ = "cvb" + tag;
    for (int i = 0; i < kStages; ++i) {
      ns_.push_back("conveyor-" + tag + "-" + std::to_string(i));
      veth_.push_back("cv" + tag + "h" + std::to_string(i));  // root side; <= 15 characters
      address_.push_back("10.77.0." + std::to_string(10 + i));
    }
    Ip({"link", "add", bridge_, "type", "bridge"});
    Ip({"addr", "add", "10.77.0.1/24", "dev", bridge_});
    Ip({"link", "set", bridge_, "up"});
    for (int i = 0; i < kStages; ++i) {
      Ip({"netns", "add", ns_[i]});
      Ip({"link", "add", veth_[i], "type", "veth", "peer", "name", "eth0", "netns", ns_[i]});
      Ip({"link", "set", veth_[i], "master", bridge_});
      Ip({"link", "set", veth_[i], "up"});
      Ip({"-n", ns_[i], "addr", "add", address_[i] + "/24", "dev", "eth0"});
      Ip({"-n", ns_[i], "link", "set", "eth0", "up"});
      Ip({"-n", ns_[i], "link", "set", "lo", "up"});
    }
  }

  void TearDown() override {
    for (const auto& ns : ns_) testing::RunCommand({"ip", "netns", "del", ns});
    for (const auto& v : veth_) testing::RunCommand({"ip", "link", "del", v});
    if (!bridge_.empty()) testing::RunCommand({"ip", "link", "del", bridge_});
  }

  void Ip(std::vector<std::string> args) {
    args.insert(args.begin(), "ip");
    testing::CommandResult r = testing::RunCommand(args);
    std::string line;
    for (const auto& a : args) line += a + " ";
    ASSERT_EQ(r.exit_code, 0) << line << "failed: " << r.err;
  }

  std::unique_ptr<cli::LocalCluster> Start() {
    cli::LocalClusterOptions options;
  options.remove_run_dir = true;
    options.stages = kStages;
    options.bin_dir = CONVEYOR_BIN_DIR;
    options.stage_hosts = address_;
    for (const auto& ns : ns_) options.stage_prefixes.push_back({"ip", "netns", "exec", ns});
    auto cluster = cli::LocalCluster::Start(options);
    EXPECT_TRUE(cluster.ok()) << cluster.status();
    return cluster.ok() ? std::move(*cluster) : nullptr;
  }

  std::string bridge_;
  std::vector<std::string> ns_, veth_, address_;
};

TEST_F(Hosts, ACutLinkIsADeadStageAndRestoringItRecovers) {
  auto cluster = Start();
  ASSERT_TRUE(cluster);
  for (int i = 0; i < kStages; ++i) EXPECT_THAT(cluster->stage_addresses()[i], HasSubstr(address_[i] + ":"));
  const std::string yaml =
      "model: {name: mlp, input_dim: 32, hidden: [64, 32]}\npartition: {stages: 3}\n"
      "data: {name: synthetic, train_samples: 2048}\nbatch_size: 32\nmicro_batches: 4\nschedule: 1f1b\n"
      "optimizer: {name: adam, lr: 0.001}\nsteps: 120\ncheckpoint_every: 10\nstage_timeout: 3\n"
      "recovery_timeout: 120\nseed: 3\n";
  const v1::JobStatus clean = testing::SubmitAndWait(cluster->coordinator_address(), yaml);
  ASSERT_EQ(clean.state(), v1::JOB_STATE_SUCCEEDED) << clean.error();
  EXPECT_EQ(clean.stages(0).transport(), v1::LINK_GRPC);

  bool cut = false, restored = false;
  v1::JobStatus end = testing::SubmitAndWait(cluster->coordinator_address(), yaml, [&](const v1::JobStatus& s) {
    if (!cut && s.step() >= 30) {
      cut = true;
      Ip({"link", "set", veth_[1], "down"});  // stage 1 vanishes without a word
    }
    if (cut && !restored && s.state() == v1::JOB_STATE_RECOVERING) {
      restored = true;
      Ip({"link", "set", veth_[1], "up"});
    }
  });
  EXPECT_TRUE(restored) << "the cut was never noticed";
  EXPECT_EQ(end.state(), v1::JOB_STATE_SUCCEEDED) << end.error();
  EXPECT_EQ(end.param_digest(), clean.param_digest());
  EXPECT_GE(end.recoveries(), 1);
}

}  // namespace
}  // namespace conveyor
