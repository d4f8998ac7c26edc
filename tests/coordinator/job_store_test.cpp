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

TEST(JobStore, UnwritablePathIsAnError) {
  auto store = JobStore::Open("/proc/no/such/dir/conveyor.db");
  EXPECT_FALSE(store.ok());
}

}  // namespace
}  // namespace conveyor
