// No run lost at its end (issue 53): `conveyor local` checks before it starts
// servers, keeps its folder only where there is something in it to read and
// says where, draws its curves where no other run's picture is, keeps the
// weights that a full disk refused; `conveyor submit --wait` follows its job
// across an orderly restart of the coordinator.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/files.h"
#include "cli/local_cluster.h"
#include "torch_format/torch_file.h"
#include "tests/support/test_util.h"

namespace conveyor {
namespace local_run {  // named: unity builds put this file beside others

using ::testing::HasSubstr;
using ::testing::Not;
using testing::Binary;
using testing::RunCommand;

std::string WriteText(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// `path` as the programs name it once resolved (gtest's TempDir ends with a
// slash, so the folders made under it hold "//").
std::string Resolved(const std::string& path) { return std::filesystem::canonical(path).string(); }

// The conveyor-local-* folders under `dir`.
std::vector<std::string> RunFolders(const std::string& dir) {
  std::vector<std::string> found;
  for (const std::string& name : ListDir(dir))
    if (name.rfind("conveyor-local-", 0) == 0) found.push_back(dir + "/" + name);
  return found;
}

// A tmpfs mounted on `parent`/disk for the test's life (root only): inside
// the job file's folder, one of `local`'s data roots.
class SmallDisk {
 public:
  SmallDisk(const std::string& parent, const std::string& options, unsigned long flags = 0) : path_(parent + "/disk") {
    if (geteuid() != 0) {
      why_not_ = "mounting a small tmpfs needs root";
      return;
    }
    std::filesystem::create_directories(path_);
    if (::mount("tmpfs", path_.c_str(), "tmpfs", flags, options.c_str()) != 0) {
      why_not_ = std::string("cannot mount a tmpfs here: ") + std::strerror(errno);
      return;
    }
    mounted_ = true;
  }
  ~SmallDisk() {
    if (mounted_) ::umount2(path_.c_str(), MNT_DETACH);
    std::error_code ignored;
    std::filesystem::remove(path_, ignored);
  }
  SmallDisk(const SmallDisk&) = delete;
  SmallDisk& operator=(const SmallDisk&) = delete;
  const std::string& path() const { return path_; }
  const std::string& why_not() const { return why_not_; }

 private:
  const std::string path_;
  bool mounted_ = false;
  std::string why_not_;
};

// `conveyor local` runs with TMPDIR here, so that the test sees (and
// removes) every folder they leave.
class LocalRun : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* before = std::getenv("TMPDIR");
    had_tmpdir_ = before != nullptr;
    if (had_tmpdir_) tmpdir_ = before;
    setenv("TMPDIR", runs_.path().c_str(), 1);
  }
  void TearDown() override {
    if (had_tmpdir_) setenv("TMPDIR", tmpdir_.c_str(), 1);
    else unsetenv("TMPDIR");
  }
  testing::CommandResult Local(const std::string& job, const std::vector<std::string>& more = {}) {
    std::vector<std::string> argv = {Binary("conveyor"), "local", job};
    argv.insert(argv.end(), more.begin(), more.end());
    return RunCommand(argv);
  }

  const testing::ScopedTempDir runs_{"local-runs"};
  const testing::ScopedTempDir files_{"local-files"};
  bool had_tmpdir_ = false;
  std::string tmpdir_;
};

// What `train --reference` refuses before it trains, `local` refuses before
// it starts a server, leaving no folder behind.
TEST_F(LocalRun, ChecksWhatNeedsNoServerBeforeStartingOne) {
  const std::string dir = Resolved(files_.path());
  std::filesystem::create_directories(dir + "/out");
  WriteText(dir + "/plain", "a file where a folder should be\n");
  WriteText(dir + "/data.csv", "x0,x1,y\n0.5,0.25,1\n0.125,0.75,0\n");
  struct Case {
    std::string job;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"model: toy\nsteps: 2\nsave: {path: out}\n", "save.path: " + dir + "/out is a folder"},
      {"model: toy\nsteps: 2\nsave: {path: plain/weights.pt}\n", "is a file, not a folder"},
      {"model: toy\nsteps: 2\ndata: {format: tensors, train: data.csv}\n",
       "data.train: " + dir + "/data.csv: not a zip file, or a truncated one (no end of central directory record); "
       "it is text (a CSV file?)"},
  };
  for (const Case& c : cases) {
    const std::string job = WriteText(dir + "/job.yaml", c.job);
    auto r = Local(job);
    EXPECT_EQ(r.exit_code, 1) << c.job << r.err;
    EXPECT_THAT(r.err, HasSubstr(c.says)) << c.job;
    EXPECT_THAT(r.err, Not(HasSubstr("starting"))) << c.job;  // no server was started
    r = RunCommand({Binary("conveyor"), "train", job, "--reference"});
    EXPECT_EQ(r.exit_code, 1) << c.job << r.err;
    EXPECT_THAT(r.err, HasSubstr(c.says)) << c.job;
  }
  // A folder this host may not write in (root may write anywhere but on a
  // read-only file system).
  SmallDisk read_only(dir, "size=4k", MS_RDONLY);
  if (read_only.why_not().empty()) {
    const std::string job = WriteText(dir + "/job.yaml", "model: toy\nsteps: 2\nsave: {path: " + read_only.path() + "/w.pt}\n");
    auto r = Local(job);
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_THAT(r.err, HasSubstr("save.path: this host may not write in " + Resolved(read_only.path())));
    EXPECT_THAT(r.err, Not(HasSubstr("starting")));
  }
  EXPECT_THAT(RunFolders(runs_.path()), ::testing::IsEmpty());
}

// A job the coordinator refuses never started: its folder goes with the
// cluster (a job that failed keeps it, and `local` says where: below).
TEST_F(LocalRun, AJobRefusedAtSubmissionLeavesNoFolder) {
  const std::string job = WriteText(files_.path() + "/two-stages.yaml", "model: toy\npartition: {stages: 2}\nsteps: 2\n");
  auto r = Local(job, {"--stages", "1"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("the job needs 2 stages, this coordinator has 1"));
  EXPECT_THAT(RunFolders(runs_.path()), ::testing::IsEmpty()) << r.err;
}

// The default picture goes beside the weights, never over another run's;
// without save.path it goes into the run's folder, which keeps it. Nothing
// lands in the working folder.
TEST_F(LocalRun, CurvesGoBesideTheWeightsOrIntoTheRunsFolder) {
  const std::string dir = Resolved(files_.path());
  const std::string job = WriteText(dir + "/curves-job.yaml", "model: toy\nsteps: 3\nsave: {path: out/w.pt}\n");
  auto first = Local(job);
  ASSERT_EQ(first.exit_code, 0) << first.err;
  if (first.err.find("no curves:") != std::string::npos) GTEST_SKIP() << "cannot draw here: " << first.err;
  ASSERT_TRUE(std::filesystem::exists(dir + "/out/w-curves.png")) << first.err;
  EXPECT_THAT(first.err, HasSubstr("wrote " + dir + "/out/w-curves.png"));
  const std::string picture = ReadText(dir + "/out/w-curves.png");
  auto second = Local(job);
  ASSERT_EQ(second.exit_code, 0) << second.err;
  EXPECT_THAT(second.err, HasSubstr("wrote " + dir + "/out/w-curves-2.png"));
  EXPECT_EQ(ReadText(dir + "/out/w-curves.png"), picture) << "the first run's picture was overwritten";
  EXPECT_FALSE(std::filesystem::exists("curves-job-curves.png")) << "a picture in the working folder";
  EXPECT_THAT(RunFolders(runs_.path()), ::testing::IsEmpty());  // logs of jobs that succeeded

  const std::string unsaved = WriteText(dir + "/unsaved.yaml", "model: toy\nsteps: 3\n");
  auto third = Local(unsaved);
  ASSERT_EQ(third.exit_code, 0) << third.err;
  const std::vector<std::string> kept = RunFolders(runs_.path());
  ASSERT_EQ(kept.size(), 1u) << third.err;
  EXPECT_THAT(third.err, HasSubstr("its curves stay in " + kept[0] + "/curves.png"));
  const std::vector<std::string> left = ListDir(kept[0]);
  EXPECT_THAT(left, ::testing::ElementsAre("curves.png"));
  EXPECT_FALSE(std::filesystem::exists("unsaved-curves.png")) << "a picture in the working folder";
}

// A save.path without room for the weights fails the job before its first
// step, naming both sizes.
TEST_F(LocalRun, ASavePathWithoutRoomIsRefusedBeforeTraining) {
  SmallDisk disk(files_.path(), "size=4k");
  if (!disk.why_not().empty()) GTEST_SKIP() << disk.why_not();
  WriteText(disk.path() + "/filler", std::string(4096, 'x'));  // the one page it has
  const std::string job = WriteText(files_.path() + "/full.yaml", "model: toy\nsteps: 50\nsave: {path: " +
                                                                      disk.path() + "/w.pt}\n");
  auto r = Local(job);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  const std::string said = r.out + r.err;  // the job's summary, with its error, is on stdout
  EXPECT_THAT(said, HasSubstr("save.path: " + Resolved(disk.path()) +
                              " has 0 bytes free, the trained weights need about 660 bytes (165 parameters)"));
  EXPECT_THAT(said, HasSubstr("refused before the first step"));
  EXPECT_THAT(said, Not(HasSubstr("step 1/")));
}

// The disk fills up after the check (here: a tmpfs with room but no inode
// for a file): the trained weights are not lost, `local` writes them into
// its folder and says where.
TEST_F(LocalRun, WeightsThatSavePathCannotTakeAreKept) {
  SmallDisk disk(files_.path(), "size=1m,nr_inodes=1");
  if (!disk.why_not().empty()) GTEST_SKIP() << disk.why_not();
  const std::string job = WriteText(files_.path() + "/no-inode.yaml", "model: toy\nsteps: 3\nsave: {path: " +
                                                                          disk.path() + "/w.pt}\n");
  auto r = Local(job);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  const std::vector<std::string> kept = RunFolders(runs_.path());
  ASSERT_EQ(kept.size(), 1u) << r.err;
  EXPECT_THAT(r.err, HasSubstr("the trained weights are in " + kept[0] + "/w.pt"));
  EXPECT_THAT(r.err, HasSubstr("logs kept in " + kept[0] + ", with the trained weights"));
  auto weights = TorchFile::Open(kept[0] + "/w.pt");
  ASSERT_TRUE(weights.ok()) << weights.status();
  auto entries = (*weights)->TensorEntries();
  ASSERT_TRUE(entries.ok()) << entries.status();
  EXPECT_EQ(entries->size(), 4u);  // toy: two linear layers, a weight and a bias each
}

// A program running in the background whose stderr is read as it comes.
class Background {
 public:
  explicit Background(const std::vector<std::string>& argv) {
    int err[2];
    if (pipe2(err, O_CLOEXEC) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(err[1], STDERR_FILENO);
      int null = open("/dev/null", O_WRONLY);
      if (null >= 0) dup2(null, STDOUT_FILENO);
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execvp(args[0], args.data());
      _exit(127);
    }
    close(err[1]);
    err_fd_ = err[0];
  }
  ~Background() {
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (err_fd_ >= 0) close(err_fd_);
  }
  Background(const Background&) = delete;
  Background& operator=(const Background&) = delete;

  // Reads stderr until it holds `text` after `from` (true) or ends (false).
  bool ReadUntil(const std::string& text, std::size_t from = 0) {
    while (err_.find(text, from) == std::string::npos) {
      if (!ReadSome()) return false;
    }
    return true;
  }
  // Reads stderr to its end and returns the exit code.
  int Wait() {
    while (ReadSome()) {
    }
    int status = 0;
    waitpid(pid_, &status, 0);
    reaped_ = true;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  const std::string& err() const { return err_; }

 private:
  bool ReadSome() {
    char buf[4096];
    const ssize_t n = read(err_fd_, buf, sizeof buf);
    if (n <= 0) return false;
    err_.append(buf, static_cast<std::size_t>(n));
    return true;
  }

  pid_t pid_ = -1;
  int err_fd_ = -1;
  bool reaped_ = false;
  std::string err_;
};

// SIGTERM to the coordinator is a lost connection to wait through, as
// SIGKILL is: the job goes on under the next coordinator, and `submit --wait`
// follows it there to its end (it exited 1 with the job "cancelled ... the
// coordinator shut down").
TEST(SubmitWait, FollowsTheJobAcrossAnOrderlyCoordinatorRestart) {
  const testing::ScopedTempDir folder("submit-wait");
  auto cluster = testing::StartCluster(1);
  ASSERT_TRUE(cluster);
  // Long enough to be mid-run when the coordinator stops; checkpoints to go on from.
  const std::string job = WriteText(folder.path() + "/long.yaml",
                                    "model: toy\nmicro_batches: 1\nsteps: 3000\ncheckpoint_every: 50\n");
  Background cli({Binary("conveyor"), "--coordinator", cluster->coordinator_address(), "submit", job, "--wait"});
  ASSERT_TRUE(cli.ReadUntil("submitted ")) << cli.err();
  ASSERT_TRUE(cli.ReadUntil("  step ")) << cli.err();  // its first progress line: it follows the job
  cluster->Signal(-1, SIGTERM);
  ASSERT_TRUE(cluster->RestartCoordinator().ok());
  const int code = cli.Wait();
  EXPECT_THAT(cli.err(), HasSubstr("lost the coordinator")) << "the job ended before the coordinator stopped";
  EXPECT_THAT(cli.err(), HasSubstr("the coordinator answers again; following job-"));
  EXPECT_EQ(code, 0) << cli.err();
  EXPECT_THAT(cli.err(), Not(HasSubstr("the coordinator shut down")));
}

}  // namespace local_run
}  // namespace conveyor
