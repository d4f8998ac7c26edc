// Real stage_server and coordinator processes on loopback (port 0, addresses
// read back from port files): equality with the reference over gRPC, and bad
// input answered with the right status while the servers keep serving.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>

#include "cli/local_cluster.h"
#include "plan/job_spec.h"
#include "common/net.h"
#include "common/wire.h"
#include "conveyor.grpc.pb.h"
#include "coordinator/coordinator.h"
#include "tests/support/in_process.h"
#include "tests/support/test_util.h"

namespace conveyor {
namespace {

using ::testing::HasSubstr;

using testing::StartCluster;

// Pipelined runs over stage server processes equal the reference: see
// PipelineEquality (equality_test.cpp), parameterised over transports.

class BadInput : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { cluster_ = StartCluster(2).release(); }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(cluster_); }

  grpc::Status Submit(const std::string& yaml) {
    auto stub = v1::Coordinator::NewStub(MakeChannel(cluster_->coordinator_address()));
    v1::SubmitJobRequest req;
    req.set_job_yaml(yaml);
    v1::SubmitJobReply reply;
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineAfter(30));
    return stub->SubmitJob(&ctx, req, &reply);
  }

  // Configures stage 1 (the last of 2) for a toy job, as the coordinator would.
  void ConfigureLastStage(const std::string& job_id) {
    auto stub = v1::StageControl::NewStub(MakeChannel(cluster_->stage_addresses()[1]));
    v1::StageAssignment a;
    a.set_job_id(job_id);
    auto spec = ParseYaml("model: toy\npartition: {stages: 2}\nbatch_size: 8\nmicro_batches: 2\n");
    *a.mutable_spec() = spec;
    a.set_stage_index(1);
    a.set_num_stages(2);
    a.set_num_chunks(2);
    v1::ChunkAssignment* c = a.add_chunks();
    c->set_index(1);
    c->set_layer_begin(1);
    c->set_layer_end(3);
    c->add_input_sample_shape(10);
    v1::ConfigureReply reply;
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineAfter(30));
    grpc::Status st = stub->Configure(&ctx, a, &reply);
    ASSERT_TRUE(st.ok()) << st.error_message();
  }

  static v1::JobSpec ParseYaml(const std::string& yaml) {
    auto spec = ParseJobYaml(yaml);
    EXPECT_TRUE(spec.ok()) << spec.status();
    return *spec;
  }

  // Pushes one frame on a fresh stream to stage 1 and returns how the stream ended.
  grpc::Status Push(const v1::TensorFrame& frame) {
    auto stub = v1::StageData::NewStub(MakeChannel(cluster_->stage_addresses()[1]));
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineAfter(30));
    v1::PushReply reply;
    auto writer = stub->Push(&ctx, &reply);
    writer->Write(frame);
    writer->WritesDone();
    return writer->Finish();
  }

  void ExpectStageServes() {
    auto stub = v1::StageControl::NewStub(MakeChannel(cluster_->stage_addresses()[1]));
    v1::StageInfo info;
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineAfter(30));
    EXPECT_TRUE(stub->GetInfo(&ctx, v1::Empty(), &info).ok());
  }

  static cli::LocalCluster* cluster_;
};

cli::LocalCluster* BadInput::cluster_ = nullptr;


v1::TensorFrame Activation(const std::string& job, std::vector<int64_t> shape, v1::DType dtype) {
  v1::TensorFrame f;
  f.set_job_id(job);
  f.set_phase(v1::PHASE_TRAIN);
  f.set_step(0);
  f.set_micro_batch(0);
  f.set_kind(v1::FRAME_ACTIVATION);
  f.set_chunk(1);  // stage 1 holds model chunk 1
  f.mutable_tensor()->set_dtype(dtype);
  int64_t bytes = DTypeSize(dtype);
  for (int64_t d : shape) {
    f.mutable_tensor()->add_shape(d);
    bytes *= d;
  }
  f.mutable_tensor()->mutable_data()->resize(static_cast<std::size_t>(bytes));
  return f;
}

TEST_F(BadInput, ATensorOfTheWrongShapeOrDtypeIsRefused) {
  ConfigureLastStage("job-x");
  grpc::Status st = Push(Activation("job-x", {4, 11}, v1::DTYPE_FLOAT32));
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(), HasSubstr("has shape [4, 11], expected [4, 10]"));
  st = Push(Activation("job-x", {4, 10}, v1::DTYPE_FLOAT64));
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(), HasSubstr("dtype float64, expected float32"));
  st = Push(Activation("job-other", {4, 10}, v1::DTYPE_FLOAT32));
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  st = Push(Activation("job-x", {4, 10}, v1::DTYPE_FLOAT32));
  EXPECT_TRUE(st.ok()) << st.error_message();
  ExpectStageServes();
}

TEST_F(BadInput, AnOversizedMessageIsRefusedBeforeItIsBuffered) {
  v1::TensorFrame f = Activation("job-x", {1}, v1::DTYPE_FLOAT32);
  f.mutable_tensor()->mutable_data()->resize(static_cast<std::size_t>(kMaxMessageBytes) + 16);
  grpc::Status st = Push(f);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
  ExpectStageServes();
}

TEST_F(BadInput, BadJobFilesAreInvalidArgument) {
  grpc::Status st = Submit("model: toy\nmicro_batchs: 2\n");
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(), HasSubstr("micro_batchs: unknown key"));
  st = Submit("model: toy\nbatch_size: 4\nmicro_batches: 5\n");
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(), HasSubstr("larger than batch_size"));
  st = Submit("model: toy\npartition: {boundaries: [1, 2, 3]}\n");
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  st = Submit("model: toy\noptimizer: {name: sgd, lr: x}\n");
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(), HasSubstr("optimizer.lr"));
}

TEST_F(BadInput, UnknownJobIdsAreNotFound) {
  auto stub = v1::Coordinator::NewStub(MakeChannel(cluster_->coordinator_address()));
  v1::GetJobRequest get;
  get.set_job_id("job-31337");
  v1::JobStatus status;
  grpc::ClientContext ctx;
  EXPECT_EQ(stub->GetJob(&ctx, get, &status).error_code(), grpc::StatusCode::NOT_FOUND);
  v1::JobRef ref;
  ref.set_job_id("job-31337");
  grpc::ClientContext ctx2;
  EXPECT_EQ(stub->CancelJob(&ctx2, ref, &status).error_code(), grpc::StatusCode::NOT_FOUND);
  grpc::ClientContext ctx3;
  auto reader = stub->WatchJob(&ctx3, get);
  while (reader->Read(&status)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(BadInput, AMissingDatasetIsRefusedAtSubmissionNamingThePath) {
  grpc::Status st = Submit("model: convnet\ndata: {name: fashion-mnist, path: /missing/fmnist}\n");
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(st.error_message(), HasSubstr("data.path: /missing/fmnist"));
  // The cluster still runs jobs.
  EXPECT_EQ(testing::SubmitAndWait(cluster_->coordinator_address(), "model: toy\nsteps: 2\n").state(), v1::JOB_STATE_SUCCEEDED);
}

// A stage address that accepts TCP connections but never speaks gRPC: the
// job fails by its deadline instead of hanging.
TEST(DeadStage, AStageThatDoesNotAnswerFailsTheJobByItsDeadline) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(listen(fd, 16), 0);
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const std::string silent = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));

  CoordinatorOptions options;
  options.stages = {silent};
  auto c = Coordinator::Start(options);
  ASSERT_TRUE(c.ok());
  auto id = (*c)->Submit("model: toy\nstage_timeout: 1\n");
  ASSERT_TRUE(id.ok());
  uint64_t version = 0;
  v1::JobStatus s;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (s.state() != v1::JOB_STATE_FAILED && std::chrono::steady_clock::now() < deadline) {
    auto r = (*c)->Watch(*id, &version, deadline, true);
    ASSERT_TRUE(r.ok());
    s = *r;
  }
  EXPECT_EQ(s.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(s.error(), HasSubstr("stage 0"));
  EXPECT_THAT(s.error(), HasSubstr(silent));
  EXPECT_THAT(s.error(), HasSubstr("did not answer"));
  close(fd);
}

// Out of memory on a CPU stage: a TorchScript layer asks for a petabyte once
// it sees more than two samples (the shape probes send one, so the job is
// accepted and configured), which the CPU allocator refuses. The job fails
// with RESOURCE_EXHAUSTED naming the stage, the action, what it held and the
// allocator's message; the same stage server process trains the next job.
// The GPU's own case: tests/gpu/gpu_test.cpp.
TEST(OutOfMemory, AStepThatCannotAllocateFailsTheJobAndTheServerServesTheNext) {
  if (testing::RunCommand({"/usr/bin/python3", "-c", "import torch"}).exit_code != 0)
    GTEST_SKIP() << "no /usr/bin/python3 that imports torch (Debian's python3-torch)";
  const testing::ScopedTempDir folder("oom");
  const std::string& dir = folder.path();
  // TorchScript compiles from the source file: a file, not `python3 -c`.
  std::ofstream(dir + "/make.py") <<
       "import sys, torch, torch.nn as nn\n"
       "class Greedy(nn.Module):\n"
       "    def forward(self, x):\n"
       "        if x.size(0) > 2:\n"
       "            return x + torch.empty([281474976710656], dtype=torch.uint8).sum()\n"
       "        return x\n"
       "torch.jit.script(nn.Sequential(nn.Flatten(), nn.Linear(64, 10), Greedy())).save(sys.argv[1] + '/model.pt')\n"
       "torch.save({'inputs': torch.randn(32, 1, 8, 8), 'targets': torch.randint(0, 10, (32,))}, "
       "sys.argv[1] + '/train.pt')\n";
  auto made = testing::RunCommand({"/usr/bin/python3", dir + "/make.py", dir});
  ASSERT_EQ(made.exit_code, 0) << made.err;
  cli::LocalClusterOptions options;
  options.stages = 1;
  options.bin_dir = CONVEYOR_BIN_DIR;
  options.remove_run_dir = true;
  options.data_roots = {dir};
  auto cluster = cli::LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string address = (*cluster)->coordinator_address();
  const v1::JobStatus greedy = testing::SubmitAndWait(
      address, "model: {torchscript: model.pt}\ndata: {format: tensors, train: train.pt}\nbatch_size: 16\n"
               "steps: 2\noptimizer: {name: sgd, lr: 0.05, momentum: 0.9}\n");
  ASSERT_EQ(greedy.state(), v1::JOB_STATE_FAILED) << greedy.error();
  EXPECT_EQ(greedy.error_code(), "RESOURCE_EXHAUSTED") << greedy.error();
  EXPECT_THAT(greedy.error(), HasSubstr("stage 0 step 0, forward of micro-batch 0 on cpu: out of memory"));
  EXPECT_THAT(greedy.error(), HasSubstr("holding parameters 2.5 KiB"));
  EXPECT_THAT(greedy.error(), HasSubstr("the allocation that failed: "));
  EXPECT_THAT(greedy.error(), HasSubstr("281474976710656 bytes"));  // the CPU allocator's own words
  const v1::JobStatus next = testing::SubmitAndWait(address, "model: toy\nsteps: 3\n");
  EXPECT_EQ(next.state(), v1::JOB_STATE_SUCCEEDED) << next.error();
}

}  // namespace
}  // namespace conveyor
