#include "transport/work_queue.h"

#include <gtest/gtest.h>

#include <thread>

namespace conveyor {
namespace {

using std::chrono::microseconds;

TEST(WorkQueueTest, ItemsComeOutInOrder) {
  WorkQueue<int> q("test queue");
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(q.Push(i).ok());
  for (int i = 0; i < 3; ++i) EXPECT_EQ(q.Pop(std::nullopt), i);
  EXPECT_EQ(q.Pop(microseconds(1)), std::nullopt);  // empty: the wait ends
  EXPECT_FALSE(q.closed());
}

TEST(WorkQueueTest, CloseWakesTheConsumerAndRefusesItems) {
  WorkQueue<int> q("link to stage 1");
  std::optional<int> got = 42;
  std::thread consumer([&] { got = q.Pop(std::nullopt); });  // blocks: nothing queued
  EXPECT_TRUE(q.Close());
  consumer.join();
  EXPECT_EQ(got, std::nullopt);
  EXPECT_TRUE(q.closed());
  EXPECT_FALSE(q.Close());
  Status st = q.Push(1);
  EXPECT_TRUE(absl::IsCancelled(st)) << st;
  EXPECT_NE(st.message().find("link to stage 1"), std::string::npos) << st;
}

TEST(WorkQueueTest, AFailureDropsItemsAndIsWhatPushesGet) {
  WorkQueue<int> q("test queue");
  ASSERT_TRUE(q.Push(1).ok());
  q.Fail(absl::UnavailableError("peer gone"));
  q.Fail(absl::InternalError("later"));  // the first reason stays
  EXPECT_EQ(q.Pop(microseconds(1)), std::nullopt);
  EXPECT_EQ(q.Push(2), absl::UnavailableError("peer gone"));
  EXPECT_EQ(q.error(), absl::UnavailableError("peer gone"));
}

TEST(WorkQueueTest, WakeEndsAWaitWithoutAnItem) {
  WorkQueue<int> q("test queue");
  std::optional<int> got = 42;
  std::thread consumer([&] { got = q.Pop(std::nullopt); });  // would block forever without the wake
  q.Wake();
  consumer.join();
  EXPECT_EQ(got, std::nullopt);
  EXPECT_FALSE(q.closed());
  ASSERT_TRUE(q.Push(7).ok());  // a wake is used up once; items still come
  EXPECT_EQ(q.Pop(std::nullopt), 7);
}

}  // namespace
}  // namespace conveyor
