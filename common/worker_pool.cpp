#include "common/worker_pool.h"

namespace conveyor {

WorkerPool::WorkerPool(int threads) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void WorkerPool::RunAll(const std::vector<std::function<void()>>& tasks) {
  if (tasks.empty()) return;
  std::unique_lock<std::mutex> lock(mu_);
  tasks_ = &tasks;
  next_ = 0;
  done_ = 0;
  work_cv_.notify_all();
  done_cv_.wait(lock, [&] { return done_ == tasks.size(); });
  tasks_ = nullptr;
}

void WorkerPool::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [this] { return stop_ || (tasks_ && next_ < tasks_->size()); });
    if (stop_) return;
    const std::function<void()>& task = (*tasks_)[next_++];
    lock.unlock();
    task();
    lock.lock();
    if (++done_ == tasks_->size()) done_cv_.notify_all();
  }
}

}  // namespace conveyor
