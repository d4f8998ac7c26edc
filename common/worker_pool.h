// A fixed set of threads that run one batch of tasks at a time: the
// coordinator calls every stage at once, each step, without a thread per call.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace conveyor {

class WorkerPool {
 public:
  explicit WorkerPool(int threads);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Runs every task, at most `threads` at once, and returns when all are done.
  // Not reentrant: one RunAll at a time.
  void RunAll(const std::vector<std::function<void()>>& tasks);

 private:
  void Loop();

  std::mutex mu_;  // guards everything below
  std::condition_variable work_cv_, done_cv_;
  const std::vector<std::function<void()>>* tasks_ = nullptr;
  std::size_t next_ = 0, done_ = 0;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace conveyor
