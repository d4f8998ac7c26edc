// What a new user hits first, at the unit level: job files typed by YAML 1.2's
// core schema, job files that are not text, addresses checked before they
// are dialled, and folders locked by the process that uses them.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>

#include "common/files.h"
#include "plan/job_spec.h"
#include "common/net.h"
#include "tests/support/test_util.h"

namespace conveyor {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

Status Parse(const std::string& yaml) { return ParseJobYaml(yaml).status(); }

TEST(CoreSchema, AQuotedScalarIsAString) {
  EXPECT_THAT(Parse("model: toy\nepochs: \"1\"\n").message(),
              HasSubstr("epochs: expected an integer, got the string \"1\""));
  EXPECT_THAT(Parse("model: toy\nbatch_size: '128'\n").message(), HasSubstr("batch_size: expected an integer"));
  EXPECT_THAT(Parse("model: toy\noptimizer: {name: sgd, lr: \"0.1\"}\n").message(),
              HasSubstr("optimizer.lr: expected a number"));
  EXPECT_THAT(Parse("model: toy\neval: \"true\"\n").message(), HasSubstr("eval: expected true or false"));
  // A quoted name is fine: it is a string either way.
  EXPECT_TRUE(Parse("model: \"toy\"\nschedule: '1f1b'\n").ok());
}

TEST(CoreSchema, BoolsAreTrueAndFalseOnly) {
  for (const char* word : {"true", "True", "TRUE", "false", "False", "FALSE"})
    EXPECT_TRUE(Parse(std::string("model: toy\neval: ") + word + "\n").ok()) << word;
  for (const char* word : {"yes", "no", "on", "off", "y", "1", "0"}) {
    Status st = Parse(std::string("model: toy\neval: ") + word + "\n");
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << word;
    EXPECT_THAT(st.message(), HasSubstr("eval: expected true or false")) << word;
  }
  EXPECT_THAT(Parse("model: toy\nrecompute: yes\n").message(), HasSubstr("recompute: expected true, false"));
}

TEST(CoreSchema, NumbersFollowTheCoreSchema) {
  auto spec = ParseJobYaml("model: toy\nbatch_size: 0x10\nmicro_batches: 0o4\noptimizer: {name: sgd, lr: 1}\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->batch_size(), 16);
  EXPECT_EQ(spec->micro_batches(), 4);
  EXPECT_EQ(spec->optimizer().lr(), 1.0);  // an integer is a number
  EXPECT_THAT(Parse("model: toy\nbatch_size: 8.0\n").message(), HasSubstr("batch_size: expected an integer, got the number 8.0"));
  EXPECT_THAT(Parse("model: toy\nbatch_size: 99999999999\n").message(), HasSubstr("batch_size: must be between 1 and 1000000, got 99999999999"));
  EXPECT_THAT(Parse("model: toy\nseed: -1\n").message(), HasSubstr("seed: must be at least 0, got -1"));
  EXPECT_THAT(Parse("model: toy\npartition: {boundaries: [1, '2']}\n").message(),
              HasSubstr("partition.boundaries: item 1: expected an integer"));
  EXPECT_THAT(Parse("model: toy\noptimizer: {name: adam, betas: [0.9, '0.99']}\n").message(),
              HasSubstr("optimizer.betas: item 1: expected a number"));
  EXPECT_TRUE(Parse("model: toy\nmatmul_sm_carveout: 8\n").ok());
  EXPECT_TRUE(Parse("model: toy\nmatmul_sm_carveout: auto\n").ok());
  EXPECT_THAT(Parse("model: toy\nmatmul_sm_carveout: '8'\n").message(), HasSubstr("matmul_sm_carveout: expected auto"));
}

TEST(CoreSchema, NamesAreStrings) {
  EXPECT_THAT(Parse("model: toy\nname: 2024\n").message(), HasSubstr("name: expected a name, got the integer 2024"));
  EXPECT_TRUE(Parse("model: toy\nname: '2024'\n").ok());
  EXPECT_THAT(Parse("model: 5\n").message(), HasSubstr("model: expected a name or a mapping, got the integer 5"));
}

TEST(JobFiles, TextThatIsNotUtf8IsRefusedNamingTheByte) {
  Status st = Parse(std::string("model: toy\nname: a\xff\n"));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("not text (YAML): byte 18 (0xff) is not UTF-8"));
  EXPECT_THAT(Parse(std::string("model: toy\0", 11)).message(), HasSubstr("byte 10 (0x00)"));
  EXPECT_TRUE(Parse("model: toy\nname: caf\xc3\xa9\n").ok());  // UTF-8 is fine
  EXPECT_THAT(Parse("").message(), HasSubstr("the job file is empty"));
  EXPECT_THAT(Parse("# only a comment\n").message(), HasSubstr("the job file is empty"));
}

// yaml-cpp calls a tab "illegal map value" or "illegal tab when looking for
// indentation": the message names the tab and its line.
TEST(JobFiles, ATabIsNamedWithItsLine) {
  Status st = Parse("model:\n\tname: toy\n");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("line 2, column 6: illegal map value (line 2 has a tab at column 1: YAML "
                                      "indents with spaces, never tabs; replace it with spaces)"));
  EXPECT_THAT(Parse("model: toy\noptimizer:\n  name: sgd\n \tlr: 0.1\n").message(), HasSubstr("line 4 has a tab at column 2"));
  EXPECT_THAT(Parse("model: toy\nsteps: [1\n").message(), Not(HasSubstr("tab")));
}

TEST(JobFiles, FoldersAndMissingFilesAreNamed) {
  auto folder = ReadJobFile(::testing::TempDir());
  EXPECT_EQ(folder.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(folder.status().message(), HasSubstr("is a folder, not a job file"));
  auto missing = ReadJobFile(::testing::TempDir() + "/no-such-job.yaml");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("no-such-job.yaml does not exist"));
}

TEST(JobFiles, AMissingDatasetIsFoundBeforeTheJobRuns) {
  auto spec = ParseJobYaml("model: convnet\ndata: {name: fashion-mnist, path: /missing/fmnist}\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  Status st = CheckJobFiles(*spec);
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(st.message(), HasSubstr("data.path: /missing/fmnist is not a folder here"));
  const testing::ScopedTempDir folder("half-fmnist");
  const std::string& dir = folder.path();
  std::ofstream(dir + "/train-images-idx3-ubyte.gz") << "x";
  spec->mutable_data()->set_path(dir);
  EXPECT_THAT(CheckJobFiles(*spec).message(), HasSubstr("has no train-labels-idx1-ubyte.gz"));
  EXPECT_TRUE(CheckJobFiles(*ParseJobYaml("model: toy\n")).ok());  // synthetic data names no file
}

TEST(Addresses, AreCheckedBeforeTheyAreDialled) {
  EXPECT_TRUE(CheckAddress("127.0.0.1:50050", "--coordinator").ok());
  EXPECT_TRUE(CheckAddress("stage-0.stages.ns.svc:50051", "--stages").ok());
  EXPECT_TRUE(CheckAddress("[::1]:50050", "--coordinator").ok());
  EXPECT_TRUE(CheckAddress("unix:/tmp/socket", "--coordinator").ok());
  EXPECT_TRUE(CheckAddress("127.0.0.1:0", "--listen", /*listen=*/true).ok());
  EXPECT_THAT(CheckAddress("127.0.0.1", "--coordinator").message(),
              HasSubstr("--coordinator: '127.0.0.1' has no port (expected HOST:PORT"));
  EXPECT_THAT(CheckAddress("127.0.0.1:0", "--coordinator").message(), HasSubstr("has port 0"));
  EXPECT_THAT(CheckAddress("host:70000", "x").message(), HasSubstr("has port 70000"));
  EXPECT_THAT(CheckAddress(":50050", "x").message(), HasSubstr("has no host"));
  EXPECT_THAT(CheckAddress("::1:50050", "x").message(), HasSubstr("IPv6 address without brackets"));
  EXPECT_THAT(CheckAddress("a b:1", "x").message(), HasSubstr("has a host name with ' '"));
  EXPECT_EQ(CheckAddress("garbage", "x").code(), absl::StatusCode::kInvalidArgument);
}

TEST(Addresses, UnreachablePeersAreSaidInWords) {
  EXPECT_THAT(DescribeUnreachable("failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: "
                                  "Failed to connect to remote host: Connection refused"),
              HasSubstr("connection refused"));
  EXPECT_EQ(DescribeUnreachable("DNS resolution failed for garbage:1: C-ares status is not ARES_SUCCESS qtype=A "
                                "name=garbage is_balancer=0: Domain name not found"),
            "host not found ('garbage')");
  EXPECT_THAT(DescribeUnreachable("failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:4: "
                                  "connection attempt timed out before receiving SETTINGS frame"),
              HasSubstr("did not answer: it accepts connections but sent no gRPC handshake"));
}

TEST(DirLock, OneHolderAtATimeAndNothingLeftWhenItDies) {
  const testing::ScopedTempDir folder("locked-state");
  const std::string& dir = folder.path();
  {
    auto first = DirLock::Acquire(dir, "state folder");
    ASSERT_TRUE(first.ok()) << first.status();
    auto second = DirLock::Acquire(dir, "state folder");
    EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(second.status().message(),
                HasSubstr("state folder " + dir + " is in use by another process (pid " + std::to_string(getpid())));
  }
  EXPECT_TRUE(DirLock::Acquire(dir, "state folder").ok());  // released with its holder

  // A holder killed with SIGKILL leaves nothing to clean up.
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  pid_t child = fork();
  if (child == 0) {
    auto held = DirLock::Acquire(dir, "state folder");
    char c = held.ok() ? 'y' : 'n';
    (void)!write(ready[1], &c, 1);
    pause();
    _exit(0);
  }
  char c = 0;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  ASSERT_EQ(c, 'y');
  EXPECT_EQ(DirLock::Acquire(dir, "state folder").status().code(), absl::StatusCode::kFailedPrecondition);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  EXPECT_TRUE(DirLock::Acquire(dir, "state folder").ok());
  close(ready[0]);
  close(ready[1]);
}

}  // namespace
}  // namespace conveyor
