// The two thread owners everything else runs on: SerialExecutor (a stage's
// one thread) and WorkerPool (the coordinator's calls to every stage at once).
// Torch-free, so that ThreadSanitizer runs them (tests/sanitizers).
#include "common/executor.h"
#include "common/worker_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace conveyor {
namespace {

TEST(SerialExecutor, RunsTasksFromManyThreadsOneAtATime) {
  SerialExecutor executor;
  int counter = 0;  // touched only on the executor's thread
  std::vector<std::thread> callers;
  for (int t = 0; t < 4; ++t) {
    callers.emplace_back([&] {
      for (int i = 0; i < 500; ++i) executor.Run([&] { return ++counter; }, -1);
    });
  }
  for (auto& c : callers) c.join();
  EXPECT_EQ(executor.Run([&] { return counter; }, -1), 2000);
}

TEST(SerialExecutor, AfterShutdownRunReturnsTheFallbackWithoutRunningTheTask) {
  SerialExecutor executor;
  executor.Shutdown();
  bool ran = false;
  EXPECT_EQ(executor.Run([&] { ran = true; return 1; }, 7), 7);
  EXPECT_FALSE(ran);
  executor.Shutdown();  // idempotent
}

TEST(SerialExecutor, AShutdownWhileCallersWaitAnswersEachWithItsResultOrTheFallback) {
  SerialExecutor executor;
  std::atomic<int> answered{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 4; ++t) {
    callers.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        const int r = executor.Run([] { return 1; }, 0);
        EXPECT_TRUE(r == 0 || r == 1);
        ++answered;
      }
    });
  }
  while (answered < 100) std::this_thread::yield();
  executor.Shutdown();
  for (auto& c : callers) c.join();
  EXPECT_EQ(answered, 800);
}

TEST(WorkerPool, RunsEveryTaskOfEachBatchOnceAndReturnsWhenAllAreDone) {
  WorkerPool pool(3);
  for (int batch = 0; batch < 200; ++batch) {
    std::vector<int> ran(7, 0);  // each slot written by one task, read after RunAll
    std::vector<std::function<void()>> tasks;
    for (int i = 0; i < 7; ++i) tasks.push_back([&ran, i] { ++ran[i]; });
    pool.RunAll(tasks);
    for (int i = 0; i < 7; ++i) ASSERT_EQ(ran[i], 1) << "batch " << batch << " task " << i;
  }
  pool.RunAll({});  // nothing to run returns at once
}

}  // namespace
}  // namespace conveyor
