// A training split in several files (data.train: a glob pattern, issue 34
// item 5): the same batches as one file holding them one after another, over
// the reference and a pipeline; bad shards named; and an epoch over shards
// larger than the memory the process may use (a memory cgroup, as root).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <fcntl.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "model/state_dict.h"
#include "tests/support/test_util.h"
#include "common/files.h"

namespace conveyor {
namespace {

using ::testing::HasSubstr;
using testing::RunCommand;

// A data file of rows [begin, end) of `x` and `y`, each with its own storage.
void WriteRows(const std::string& path, const at::Tensor& x, const at::Tensor& y, int64_t begin, int64_t end) {
  const Status st = WriteStateDict(path, {{"inputs", x.slice(0, begin, end).clone()},
                                          {"targets", y.slice(0, begin, end).clone()}});
  ASSERT_TRUE(st.ok()) << st;
}

// Runs `conveyor ARGS... JOB --json` on `yaml`; the summary's JSON, or null.
nlohmann::json RunConveyor(const std::string& dir, const std::string& yaml, std::vector<std::string> args) {
  const std::string job = dir + "/job-" + std::to_string(std::hash<std::string>()(yaml + args[0])) + ".yaml";
  std::ofstream(job) << yaml;
  std::vector<std::string> argv = {testing::Binary("conveyor")};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.insert(argv.begin() + 2, job);
  argv.push_back("--json");
  if (args[0] == "local") argv.insert(argv.end(), {"--curves", ""});  // none in the working folder
  const testing::CommandResult r = RunCommand(argv);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  if (r.exit_code != 0) return nullptr;
  return nlohmann::json::parse(r.out);
}

TEST(Shards, ATrainingSplitInShardsTrainsAsOneFileHoldingThemInOrder) {
  const std::string dir = std::filesystem::canonical(testing::MakeTempDir("shards")).string();
  at::manual_seed(7);
  const at::Tensor x = at::randn({100, 8}), y = at::randint(10, {100}, at::kLong);
  WriteRows(dir + "/all.pt", x, y, 0, 100);
  // Uneven shards, named so that name order is row order.
  WriteRows(dir + "/part-0.pt", x, y, 0, 37);
  WriteRows(dir + "/part-1.pt", x, y, 37, 60);
  WriteRows(dir + "/part-2.pt", x, y, 60, 100);
  const std::string job = "model: {name: mlp, input_dim: 8, hidden: [16]}\nbatch_size: 16\nmicro_batches: 2\n"
                          "partition: {stages: 2}\nsteps: 14\noptimizer: {name: adam, lr: 0.01}\nseed: 3\n";
  const std::string one = job + "data: {format: tensors, train: " + dir + "/all.pt}\n";
  const std::string shards = job + "data: {format: tensors, train: " + dir + "/part-*.pt}\n";
  // 14 steps of 16 from 100 samples: past the first epoch (6 steps), into a new order.
  for (const std::vector<std::string>& how :
       {std::vector<std::string>{"train", "--reference"}, std::vector<std::string>{"local", "--stages", "2"}}) {
    const nlohmann::json a = RunConveyor(dir, one, how), b = RunConveyor(dir, shards, how);
    ASSERT_FALSE(a.is_null() || b.is_null()) << how[0];
    ASSERT_EQ(a["losses"].size(), 14u);
    EXPECT_EQ(a["losses"], b["losses"]) << how[0];
    EXPECT_EQ(a["param_digest"], b["param_digest"]) << how[0];
  }

  // A list names the shards in its own order: the same as one file holding them so.
  WriteRows(dir + "/listed.pt", at::cat({x.slice(0, 60, 100), x.slice(0, 0, 60)}),
            at::cat({y.slice(0, 60, 100), y.slice(0, 0, 60)}), 0, 100);
  const nlohmann::json c = RunConveyor(dir, job + "data: {format: tensors, train: " + dir + "/listed.pt}\n",
                                       {"train", "--reference"});
  const nlohmann::json d = RunConveyor(dir, job + "data: {format: tensors, train: [" + dir + "/part-2.pt, " + dir +
                                                "/part-0.pt, " + dir + "/part-1.pt]}\n",
                                       {"train", "--reference"});
  ASSERT_FALSE(c.is_null() || d.is_null());
  EXPECT_EQ(c["losses"], d["losses"]);
  EXPECT_EQ(c["param_digest"], d["param_digest"]);

  // A pattern that matches nothing, and a shard whose samples differ, are named.
  std::ofstream(dir + "/none.yaml") << job + "data: {format: tensors, train: " + dir + "/nothing-*.pt}\n";
  testing::CommandResult r = RunCommand({testing::Binary("conveyor"), "train", dir + "/none.yaml", "--reference"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("data.train: the pattern " + dir + "/nothing-*.pt matches no file"));
  EXPECT_THAT(r.err, HasSubstr("NOT_FOUND"));
  WriteRows(dir + "/part-3.pt", at::randn({10, 9}), at::randint(10, {10}, at::kLong), 0, 10);
  std::ofstream(dir + "/odd.yaml") << shards;
  r = RunCommand({testing::Binary("conveyor"), "train", dir + "/odd.yaml", "--reference"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("data.train: the shard " + dir + "/part-3.pt holds inputs of Float samples of shape [9]"));
  EXPECT_THAT(r.err, HasSubstr("INVALID_ARGUMENT"));
  RemoveTree(dir);
}

// The memory cgroup (v1) this process is in, as a folder; "" where there is none.
std::string OwnMemoryCgroup() {
  std::ifstream in("/proc/self/cgroup");
  for (std::string line; std::getline(in, line);) {
    const auto at = line.find(":memory:");
    if (at == std::string::npos) continue;
    const std::string dir = "/sys/fs/cgroup/memory" + line.substr(at + 8);
    if (std::filesystem::exists(dir + "/memory.limit_in_bytes")) return dir;
  }
  return "";
}

// 64 MiB of shards, one epoch over all of them in shuffled order, by
// `conveyor train --reference` in a memory cgroup limited to 96 MiB (about
// 30 MiB above what the process needs without its data): the
// shards are mapped, so the kernel drops their pages as it needs to, where
// data read into memory would have the process killed. Root only (CI runs as
// root); skips where no memory cgroup can be made.
TEST(Shards, AnEpochOverShardsLargerThanTheMemoryLimitTrains) {
  const std::string parent = OwnMemoryCgroup();
  if (geteuid() != 0 || parent.empty()) GTEST_SKIP() << "needs root and a cgroup v1 memory controller";
  const std::string cgroup = parent + "/conveyor-shards-" + std::to_string(getpid());
  std::error_code ec;
  if (!std::filesystem::create_directory(cgroup, ec)) GTEST_SKIP() << "cannot make " << cgroup << ": " << ec.message();
  constexpr int64_t kLimit = 96 << 20;
  std::ofstream(cgroup + "/memory.limit_in_bytes") << kLimit;
  const std::string dir = testing::MakeTempDir("big-shards");
  constexpr int64_t kRows = 16384, kWidth = 256;  // 16 MiB of float inputs a shard
  for (int k = 0; k < 4; ++k) {
    at::manual_seed(k);
    const std::string path = dir + "/shard-" + std::to_string(k) + ".pt";
    WriteRows(path, at::randn({kRows, kWidth}), at::randint(10, {kRows}, at::kLong), 0, kRows);
    // Out of the page cache: pages cached by this process stay charged to
    // its cgroup, and the child would find them there for free.
    const int fd = ::open(path.c_str(), O_RDONLY);
    ASSERT_GE(fd, 0) << path;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
  std::ofstream(dir + "/job.yaml") << "model: {name: mlp, input_dim: 256, hidden: [16]}\nbatch_size: 256\n"
                                      "epochs: 1\noptimizer: {name: sgd, lr: 0.01}\n"
                                      "data: {format: tensors, train: " + dir + "/shard-*.pt}\n";
  // The child enters the cgroup, then becomes `conveyor`: all it maps and allocates counts there.
  const testing::CommandResult r =
      RunCommand({"/bin/sh", "-c", "echo $$ > " + cgroup + "/cgroup.procs && exec " + testing::Binary("conveyor") +
                                       " train " + dir + "/job.yaml --reference --json"});
  std::string peak, hits;
  std::getline(std::ifstream(cgroup + "/memory.max_usage_in_bytes"), peak);
  std::getline(std::ifstream(cgroup + "/memory.failcnt"), hits);
  std::filesystem::remove(cgroup, ec);  // empty once the child is gone
  RemoveTree(dir);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json s = nlohmann::json::parse(r.out);
  EXPECT_EQ(s["steps"], 4 * kRows / 256);
  EXPECT_LE(std::stoll(peak), kLimit);
  // The limit was reached: the data did not fit, pages were dropped.
  EXPECT_GT(std::stoll(hits), 0) << "peak " << peak << " bytes";
  std::printf("4 shards of %lld MiB under a %lld MiB limit: peak %s bytes, the limit hit %s times\n",
              static_cast<long long>(kRows * kWidth * 4 >> 20), static_cast<long long>(kLimit >> 20), peak.c_str(),
              hits.c_str());
}

}  // namespace
}  // namespace conveyor
