// `conveyor export` (issue 17): a finished job's weights, fetched by the CLI
// from the stage server processes that still hold them, written on the CLI's
// host, equal what the stages hold, bit for bit.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <map>

#include "cli/local_cluster.h"
#include "common/files.h"
#include "common/net.h"
#include "common/wire.h"
#include "conveyor.grpc.pb.h"
#include "model/state_dict.h"
#include "stage_server/checkpoint.h"
#include "transport/tensor_codec.h"
#include "tests/support/test_util.h"

namespace conveyor {
namespace {

using ::testing::HasSubstr;
using testing::Binary;
using testing::RunCommand;

// The toy zoo model (Linear, ReLU, Linear) cut over two stages.
constexpr const char* kToyJob =
    "name: toy\nmodel: {name: toy}\npartition: {stages: 2}\n"
    "data: {name: synthetic, train_samples: 256, test_samples: 64}\nbatch_size: 32\nmicro_batches: 4\n"
    "schedule: 1f1b\noptimizer: {name: sgd, lr: 0.05, momentum: 0.9}\nloss: mse\nsteps: 6\nseed: 1\n";

class Export : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster_ = testing::StartCluster(2);
    ASSERT_TRUE(cluster_);
    dir_ = testing::MakeTempDir("export");
  }
  void TearDown() override { RemoveTree(dir_); }

  testing::CommandResult Conveyor(std::vector<std::string> args) {
    args.insert(args.begin(), {Binary("conveyor"), "--coordinator", cluster_->coordinator_address()});
    return RunCommand(args);
  }

  std::unique_ptr<cli::LocalCluster> cluster_;
  std::string dir_;
};

TEST_F(Export, AFinishedJobsWeightsEqualTheStagesExactly) {
  v1::JobStatus job = testing::SubmitAndWait(cluster_->coordinator_address(), kToyJob);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.error();
  ASSERT_EQ(job.stages_size(), 2);
  const std::string file = dir_ + "/toy.pt";
  auto r = Conveyor({"export", job.job_id(), "--out", file});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("wrote " + file + ": 4 tensors"));

  std::vector<std::string> stages;
  for (const auto& s : job.stages()) stages.push_back(s.address());
  const auto held = testing::ServerParameters(stages, job.job_id());
  auto got = ReadStateDict(file);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), held.size());
  ASSERT_EQ(held.size(), 4u);  // two Linear layers: weight and bias each
  std::map<std::string, at::Tensor> by_name(got->begin(), got->end());
  for (const auto& [name, t] : held) {
    ASSERT_EQ(by_name.count(name), 1u) << name;
    EXPECT_EQ(by_name[name].scalar_type(), t.scalar_type()) << name;
    EXPECT_TRUE(at::equal(by_name[name], t)) << name;
  }

  // PyTorch reads it with weights_only=True, where there is one.
  if (RunCommand({"/usr/bin/python3", "-c", "import torch"}).exit_code == 0) {
    r = RunCommand({"/usr/bin/python3", "-c",
                    "import sys, torch; d = torch.load(sys.argv[1], weights_only=True); "
                    "print(sorted(d), tuple(d['0.weight'].shape))",
                    file});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_THAT(r.out, HasSubstr("['0.bias', '0.weight', '2.bias', '2.weight'] (10, 10)"));
  }

  // Once another job ran, the stages hold that one instead.
  ASSERT_EQ(testing::SubmitAndWait(cluster_->coordinator_address(), kToyJob).state(), v1::JOB_STATE_SUCCEEDED);
  r = Conveyor({"export", job.job_id(), "--out", dir_ + "/gone.pt"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("the stages no longer hold " + job.job_id() +
                               " (another job ran since): use save: in the job file"));
  EXPECT_THAT(r.err, HasSubstr("(FAILED_PRECONDITION)"));
}

TEST_F(Export, AnUnknownJobIsNotFoundAndAZooJobIsNoTorchScript) {
  auto r = Conveyor({"export", "job-404", "--out", dir_ + "/none.pt"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("job-404"));
  EXPECT_THAT(r.err, HasSubstr("(NOT_FOUND)"));
  v1::JobStatus job = testing::SubmitAndWait(cluster_->coordinator_address(), kToyJob);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.error();
  r = Conveyor({"export", job.job_id(), "--out", dir_ + "/model.pt", "--format", "torchscript"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("the zoo's toy exports as a state_dict only"));
  EXPECT_THAT(r.err, HasSubstr("(INVALID_ARGUMENT)"));
  EXPECT_FALSE(std::ifstream(dir_ + "/model.pt").good());
  // save: {format: torchscript} for a zoo model is refused at submission.
  const std::string yaml = dir_ + "/save-ts.yaml";
  std::ofstream(yaml) << kToyJob << "save: {path: " << dir_ << "/saved.pt, format: torchscript}\n";
  r = Conveyor({"submit", yaml});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("save.format: torchscript needs a model from a TorchScript archive"));
  EXPECT_THAT(r.err, HasSubstr("INVALID_ARGUMENT"));
  r = Conveyor({"export", "job-1"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--out is required"));
  r = Conveyor({"export", "--out", dir_ + "/x.pt"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("give a job id, or --checkpoint-dir"));
  r = RunCommand({Binary("conveyor"), "export", "--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_THAT(r.out, HasSubstr("to a file on this host"));
}

// A stage's parameters fetched in several replies (JobRef.max_bytes) equal
// those of one reply: what lets a stage holding more than one gRPC message
// (1 GiB) export, checked here with a page of 200 bytes.
TEST_F(Export, ParametersTravelInPagesWhenAskedTo) {
  v1::JobStatus job = testing::SubmitAndWait(cluster_->coordinator_address(), kToyJob);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.error();
  int calls = 0;
  std::vector<std::pair<std::string, at::Tensor>> paged;
  for (const auto& stage : job.stages()) {
    auto stub = v1::StageControl::NewStub(MakeChannel(stage.address()));
    auto page = [&](const v1::JobRef& ref) -> StatusOr<v1::ParametersReply> {
      ++calls;
      v1::ParametersReply reply;
      grpc::ClientContext ctx;
      ctx.set_deadline(DeadlineAfter(30));
      Status st = FromGrpc(stub->GetParameters(&ctx, ref, &reply));
      if (!st.ok()) return st;
      int64_t bytes = 0;
      for (const auto& t : reply.parameters()) bytes += static_cast<int64_t>(t.tensor().data().size());
      // One tensor over the page alone (the 10x10 weight, 400 bytes), else at most 200 bytes.
      EXPECT_TRUE(reply.parameters_size() == 1 || bytes <= 200) << bytes;
      return reply;
    };
    auto all = GatherParameters(job.job_id(), page, /*page_bytes=*/200);
    ASSERT_TRUE(all.ok()) << all.status();
    for (auto& p : *all->mutable_parameters()) paged.emplace_back(p.name(), DecodeTensor(p.mutable_tensor()));
  }
  EXPECT_GE(calls, 4);  // 0.weight | 0.bias | 2.weight | 2.bias, wherever the cut is
  std::vector<std::string> stages;
  for (const auto& s : job.stages()) stages.push_back(s.address());
  const auto whole = testing::ServerParameters(stages, job.job_id());
  ASSERT_EQ(paged.size(), whole.size());
  for (std::size_t i = 0; i < whole.size(); ++i) {
    EXPECT_EQ(paged[i].first, whole[i].first);
    EXPECT_TRUE(at::equal(paged[i].second, whole[i].second)) << whole[i].first;
  }
  // A first tensor past the stage's is named.
  auto stub = v1::StageControl::NewStub(MakeChannel(job.stages(0).address()));
  v1::JobRef ref;
  ref.set_job_id(job.job_id());
  ref.set_first_tensor(99);
  v1::ParametersReply reply;
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineAfter(30));
  Status st = FromGrpc(stub->GetParameters(&ctx, ref, &reply));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), HasSubstr("from tensor 99"));
}

// Weights from the checkpoint files of a stopped cluster (issue 17, 9).
class ExportFromCheckpoints : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("export-ckpt");
    cli::LocalClusterOptions options;
    options.stages = 2;
    options.bin_dir = CONVEYOR_BIN_DIR;
    options.remove_run_dir = false;  // the checkpoints outlive the cluster; TearDown removes them
    options.data_roots = {dir_};     // where the TorchScript test's files are
    auto started = cli::LocalCluster::Start(options);
    ASSERT_TRUE(started.ok()) << started.status();
    cluster_ = std::move(*started);
    for (int s = 0; s < 2; ++s)
      ckpt_.push_back(cluster_->run_dir() + "/stage-" + std::to_string(s) + "/checkpoints");
  }
  void TearDown() override {
    if (cluster_) {
      cluster_->Stop();
      RemoveTree(cluster_->run_dir());
    }
    RemoveTree(dir_);
  }

  testing::CommandResult Export(std::vector<std::string> args) {
    args.insert(args.begin(), {Binary("conveyor"), "export"});
    return RunCommand(args);
  }

  std::unique_ptr<cli::LocalCluster> cluster_;
  std::vector<std::string> ckpt_;
  std::string dir_;
};

TEST_F(ExportFromCheckpoints, EqualTheRunningJobsExportAndPyTorchLoadsThem) {
  const std::string job_yaml = std::string(kToyJob) + "checkpoint_every: 3\n";
  v1::JobStatus job = testing::SubmitAndWait(cluster_->coordinator_address(), job_yaml);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.error();
  const std::string live = dir_ + "/live.pt", files = dir_ + "/files.pt";
  auto r = RunCommand({Binary("conveyor"), "--coordinator", cluster_->coordinator_address(), "export", job.job_id(),
                       "--out", live});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  cluster_->Stop();

  r = Export({"--checkpoint-dir", ckpt_[0], "--checkpoint-dir", ckpt_[1], "--out", files});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("wrote " + files + ": 4 tensors"));
  EXPECT_THAT(r.out, HasSubstr("of " + job.job_id() + " at step 6 from the checkpoints of 2 stage(s)"));
  auto want = ReadStateDict(live);
  ASSERT_TRUE(want.ok()) << want.status();
  auto got = ReadStateDict(files);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), want->size());
  for (std::size_t i = 0; i < want->size(); ++i) {
    EXPECT_EQ((*got)[i].first, (*want)[i].first);
    EXPECT_EQ((*got)[i].second.scalar_type(), (*want)[i].second.scalar_type());
    EXPECT_TRUE(at::equal((*got)[i].second, (*want)[i].second)) << (*want)[i].first;
  }
  if (RunCommand({"/usr/bin/python3", "-c", "import torch"}).exit_code == 0) {
    r = RunCommand({"/usr/bin/python3", "-c",
                    "import sys, torch; a = torch.load(sys.argv[1], weights_only=True); "
                    "b = torch.load(sys.argv[2], weights_only=True); "
                    "print(list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a))",
                    files, live});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, "True\n");
  }

  // An older step, named.
  r = Export({"--checkpoint-dir", ckpt_[0], "--checkpoint-dir", ckpt_[1], "--out", dir_ + "/3.pt", "--step", "3"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("at step 3"));
  auto three = ReadStateDict(dir_ + "/3.pt");
  ASSERT_TRUE(three.ok()) << three.status();
  EXPECT_FALSE(at::equal((*three)[0].second, (*want)[0].second));  // trained three steps more since
  r = Export({"--checkpoint-dir", ckpt_[0], "--checkpoint-dir", ckpt_[1], "--out", dir_ + "/4.pt", "--step", "4"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("no cut of " + job.job_id() + " has a checkpoint of step 4 on every stage: stage 0 "
                               "has 3, 6; stage 1 has 3, 6"));
  EXPECT_THAT(r.err, HasSubstr("(NOT_FOUND)"));
}

TEST_F(ExportFromCheckpoints, MissingOrMixedFoldersAreNamed) {
  const std::string job_yaml = std::string(kToyJob) + "checkpoint_every: 3\n";
  v1::JobStatus job = testing::SubmitAndWait(cluster_->coordinator_address(), job_yaml);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.error();
  cluster_->Stop();
  const std::string out = dir_ + "/out.pt";

  auto r = Export({"--checkpoint-dir", dir_ + "/nowhere", "--out", out});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("--checkpoint-dir " + dir_ + "/nowhere is not a folder"));
  EXPECT_THAT(r.err, HasSubstr("(NOT_FOUND)"));
  // Each server keeps a copy of the other's files (checkpoint_copies): one
  // server's folder is enough.
  r = Export({"--checkpoint-dir", ckpt_[0], "--out", out});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("at step 6 from the checkpoints of 2 stage(s)"));
  // Without the copies, a stage left out: its layers are in no checkpoint.
  RemoveTree(ckpt_[0] + "/" + job.job_id() + "/copy-of-stage-1");
  RemoveTree(ckpt_[1] + "/" + job.job_id() + "/copy-of-stage-0");
  r = Export({"--checkpoint-dir", ckpt_[0], "--out", out});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("no folder holds stage 1's checkpoints: pass the --checkpoint-dir of every stage"));
  // One folder twice.
  r = Export({"--checkpoint-dir", ckpt_[0], "--checkpoint-dir", ckpt_[0], "--checkpoint-dir", ckpt_[1], "--out",
              out});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("--checkpoint-dir " + ckpt_[0] + " is given twice"));
  EXPECT_THAT(r.err, HasSubstr("(INVALID_ARGUMENT)"));
  // Stages whose checkpoints have no step in common.
  const std::string a = ckpt_[0] + "/" + job.job_id() + "/stage-0/", b = ckpt_[1] + "/" + job.job_id() + "/stage-1/";
  ASSERT_EQ(std::remove((b + "step-000000000006.ckpt").c_str()), 0);
  r = Export({"--checkpoint-dir", ckpt_[0], "--checkpoint-dir", ckpt_[1], "--out", out});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("at step 3"));  // the newest step both stages have
  ASSERT_EQ(std::remove((a + "step-000000000003.ckpt").c_str()), 0);
  r = Export({"--checkpoint-dir", ckpt_[0], "--checkpoint-dir", ckpt_[1], "--out", out});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("no step has a checkpoint on every stage: stage 0 has 6; stage 1 has 3"));
  EXPECT_THAT(r.err, HasSubstr("(FAILED_PRECONDITION)"));
  // Another job's checkpoint in this job's place: named by the header's check.
  const std::string other = dir_ + "/other/" + job.job_id() + "/stage-1";
  ASSERT_TRUE(MakeDirs(other).ok());
  std::ifstream from(b + "step-000000000003.ckpt", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(from)), std::istreambuf_iterator<char>());
  // The same file under another step's name: its header says step 3.
  std::ofstream(other + "/step-000000000006.ckpt", std::ios::binary) << bytes;
  r = Export({"--checkpoint-dir", ckpt_[0], "--checkpoint-dir", dir_ + "/other", "--out", out});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("belongs to job " + job.job_id() + " stage 1 step 3"));
  EXPECT_THAT(r.err, HasSubstr("(FAILED_PRECONDITION)"));
}

// Checkpoints of two stages whose layers overlap, or leave one out: written
// here (the export checks the headers before it reads any payload).
TEST(ExportFromCheckpointFiles, ALayerInTwoStagesOrInNoneIsNamed) {
  const testing::ScopedTempDir folder("export-layers");
  const std::string& dir = folder.path();
  auto write = [&](const std::string& folder, int stage, int begin, int end) {
    v1::CheckpointHeader h;
    h.set_job_id("job-7");
    h.set_stage_index(stage);
    h.set_step(4);
    h.set_spec_digest("same");
    h.mutable_spec()->mutable_model()->set_kind(v1::MODEL_TOY);  // 3 layers
    h.mutable_spec()->mutable_partition()->set_stages(2);
    h.add_parameter_names(std::to_string(begin) + ".weight");
    v1::ChunkAssignment* c = h.add_chunks();
    c->set_index(stage);
    c->set_layer_begin(begin);
    c->set_layer_end(end);
    ASSERT_TRUE(CheckpointFiles(folder).Save(h, "not read", 3).ok());
  };
  write(dir + "/a", 0, 0, 2);
  write(dir + "/b", 1, 1, 3);
  auto r = RunCommand({Binary("conveyor"), "export", "--checkpoint-dir", dir + "/a", "--checkpoint-dir", dir + "/b",
                       "--out", dir + "/out.pt"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("layer 1 is in the checkpoints of stage 0 and of stage 1"));
  EXPECT_THAT(r.err, HasSubstr("(FAILED_PRECONDITION)"));
  write(dir + "/c", 1, 2, 2);  // an empty range: layer 2 nowhere
  r = RunCommand({Binary("conveyor"), "export", "--checkpoint-dir", dir + "/a", "--checkpoint-dir", dir + "/c",
                  "--out", dir + "/out.pt"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("layer 2 is in no stage's checkpoint"));
  EXPECT_FALSE(std::ifstream(dir + "/out.pt").good());
}

// TorchScript out (issue 17, 9): the job's archive with the trained weights,
// from the running job, from `save:` and from checkpoint files; PyTorch loads
// each with torch.jit.load, its state_dict equals the state_dict export
// exactly, and it runs forward.
TEST_F(ExportFromCheckpoints, TorchScriptArchivesHoldTheTrainedWeights) {
  if (RunCommand({"/usr/bin/python3", "-c", "import torch"}).exit_code != 0)
    GTEST_SKIP() << "no /usr/bin/python3 that imports torch (Debian's python3-torch)";
  const std::string oracle = std::string(CONVEYOR_SOURCE_DIR) + "/tests/python/oracle.py";
  auto r = RunCommand({"/usr/bin/python3", oracle, "make", "mlp", dir_ + "/mlp"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string yaml =
      "model: {torchscript: mlp/model.pt}\ndata: {format: tensors, train: mlp/train.pt}\nbatch_size: 16\n"
      "micro_batches: 2\npartition: {stages: 2}\nsteps: 4\ncheckpoint_every: 2\n"
      "optimizer: {name: sgd, lr: 0.05, momentum: 0.9}\nsave: {path: saved.pt, format: torchscript}\n";
  v1::JobStatus job = testing::SubmitAndWait(cluster_->coordinator_address(), yaml);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.error();
  const std::string coord = cluster_->coordinator_address();
  r = RunCommand({Binary("conveyor"), "--coordinator", coord, "export", job.job_id(), "--out", dir_ + "/sd.pt"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = RunCommand({Binary("conveyor"), "--coordinator", coord, "export", job.job_id(), "--out", dir_ + "/live.ts",
                  "--format", "torchscript"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("into its TorchScript archive"));
  cluster_->Stop();
  r = Export({"--checkpoint-dir", ckpt_[0], "--checkpoint-dir", ckpt_[1], "--out", dir_ + "/files.ts", "--format",
              "torchscript"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = RunCommand({"/usr/bin/python3", "-c",
                  "import sys, torch\n"
                  "sd = torch.load(sys.argv[1], weights_only=True)\n"
                  "init = torch.jit.load(sys.argv[2]).state_dict()\n"
                  "for ts in sys.argv[3:]:\n"
                  "    m = torch.jit.load(ts)\n"
                  "    got = m.state_dict()\n"
                  "    assert sorted(got) == sorted(sd), (ts, sorted(got), sorted(sd))\n"
                  "    assert all(torch.equal(got[k], sd[k]) for k in sd), ts\n"
                  "    assert not all(torch.equal(got[k], init[k]) for k in sd), ts\n"
                  "    y = m(torch.randn(3, 1, 8, 8))\n"
                  "    print(ts.rsplit('/', 1)[1], tuple(y.shape))\n",
                  dir_ + "/sd.pt", dir_ + "/mlp/model.pt", dir_ + "/saved.pt", dir_ + "/live.ts", dir_ + "/files.ts"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "saved.pt (3, 10)\nlive.ts (3, 10)\nfiles.ts (3, 10)\n");
}

}  // namespace
}  // namespace conveyor
