// model/device.h: the process's compute threads.
#include "model/device.h"

#include <gtest/gtest.h>
#include <pthread.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "common/files.h"

namespace conveyor {
namespace {

// Threads of this process named `name` (/proc/self/task/*/comm).
int ThreadsNamed(const std::string& name) {
  int n = 0;
  for (const std::string& task : ListDir("/proc/self/task")) {
    std::string comm;
    std::getline(std::ifstream("/proc/self/task/" + task + "/comm"), comm);
    n += comm == name;
  }
  return n;
}

// ComputeThreads() answers from any thread without touching LibTorch's
// pools: a gRPC handler thread asks it once a step (the stage's Info()),
// and LibTorch 1.13's at::get_num_threads() on a thread that never ran its
// work made that thread a new pthreadpool, whose workers (named after the
// thread that made them) stayed and spun: 2.7 ms a step of a tiny CPU job.
TEST(ComputeThreads, AnotherThreadAsksWithoutMakingLibTorchPools) {
  SetComputeThreads(2);
  int seen = 0;
  std::thread asker([&] {
    pthread_setname_np(pthread_self(), "threads-asker");
    seen = ComputeThreads();
  });
  asker.join();
  EXPECT_EQ(seen, 2);
  EXPECT_EQ(ThreadsNamed("threads-asker"), 0) << "threads made by the asking thread outlive it";
}

}  // namespace
}  // namespace conveyor
