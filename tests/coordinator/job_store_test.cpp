#include "coordinator/job_store.h"

#include <gtest/gtest.h>

#include <filesystem>

namespace conveyor {
namespace {

TEST(JobStore, KeepsJobsAcrossReopening) {
  const std::string path = ::testing::TempDir() + "/job_store_test.db";
  std::filesystem::remove(path);
  v1::JobSpec spec;
  spec.set_name("first");
  std::string a, b;
  {
    auto store = JobStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    auto id = (*store)->Insert(spec, "name: first", v1::JobStatus());
    ASSERT_TRUE(id.ok()) << id.status();
    a = *id;
    spec.set_name("second");
    id = (*store)->Insert(spec, "name: second", v1::JobStatus());
    ASSERT_TRUE(id.ok());
    b = *id;
    EXPECT_NE(a, b);
    auto next = (*store)->NextQueued();
    ASSERT_TRUE(next.ok());
    EXPECT_EQ(**next, a);  // submission order
    auto job = (*store)->Get(a);
    ASSERT_TRUE(job.ok());
    job->status.set_state(v1::JOB_STATE_RUNNING);
    job->status.add_losses(0.5f);
    ASSERT_TRUE((*store)->Update(job->status).ok());
    ASSERT_TRUE((*store)->AddEvent(a, "started").ok());
  }
  auto store = JobStore::Open(path);
  ASSERT_TRUE(store.ok());
  auto job = (*store)->Get(a);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->spec.name(), "first");
  EXPECT_EQ(job->status.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job->status.losses_size(), 1);
  auto running = (*store)->InState(v1::JOB_STATE_RUNNING);
  ASSERT_TRUE(running.ok());
  EXPECT_EQ(*running, std::vector<std::string>{a});
  auto next = (*store)->NextQueued();
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(**next, b);
  auto list = (*store)->List();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[0].losses_size(), 0);  // lists leave the losses out
  EXPECT_TRUE(absl::IsNotFound((*store)->Get("job-999").status()));
}

TEST(JobStore, OnlyStepsCheckpointedOnEveryStageAreComplete) {
  auto store = JobStore::Open(":memory:");
  ASSERT_TRUE(store.ok());
  v1::JobSpec spec;
  auto id = (*store)->Insert(spec, "", v1::JobStatus());
  ASSERT_TRUE(id.ok());
  auto status = (*store)->Get(*id)->status;
  auto record = [](int64_t step) {
    v1::CheckpointRecord r;
    r.set_step(step);
    r.set_path("/ckpt/" + std::to_string(step));
    return r;
  };
  // Step 10 on all three stages, step 20 on two of them (a stage died).
  status.set_step(10);
  status.add_losses(1.0f);
  ASSERT_TRUE((*store)->RecordCheckpoints(status, {{0, record(10)}, {1, record(10)}, {2, record(10)}}).ok());
  ASSERT_TRUE((*store)->RecordCheckpoints(status, {{0, record(20)}, {2, record(20)}}).ok());
  auto complete = (*store)->CompleteCheckpoints(*id, 3);
  ASSERT_TRUE(complete.ok());
  EXPECT_EQ(*complete, std::vector<int64_t>{10});
  ASSERT_TRUE((*store)->RecordCheckpoints(status, {{1, record(20)}}).ok());
  EXPECT_EQ(*(*store)->CompleteCheckpoints(*id, 3), (std::vector<int64_t>{20, 10}));
  // The status was saved with the records.
  EXPECT_EQ((*store)->Get(*id)->status.step(), 10);
  ASSERT_TRUE((*store)->DropCheckpoints(*id, 20).ok());
  EXPECT_EQ(*(*store)->CompleteCheckpoints(*id, 3), std::vector<int64_t>{10});
  EXPECT_TRUE((*store)->CompleteCheckpoints("job-404", 3)->empty());
}

TEST(JobStore, UnwritablePathIsAnError) {
  auto store = JobStore::Open("/proc/no/such/dir/conveyor.db");
  EXPECT_FALSE(store.ok());
}

}  // namespace
}  // namespace conveyor
