// A thread that runs tasks one at a time, in order. The owner of state that
// must stay on one thread (a stage's model and optimizer) runs all its work
// here; RPC threads only hand tasks over.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>

namespace conveyor {

class SerialExecutor {
 public:
  SerialExecutor();
  ~SerialExecutor();
  SerialExecutor(const SerialExecutor&) = delete;
  SerialExecutor& operator=(const SerialExecutor&) = delete;

  // Runs `fn` on the executor thread and waits for its result. After
  // Shutdown() it returns `fallback` without running `fn`.
  template <typename F, typename R = std::invoke_result_t<F>>
  R Run(F fn, R fallback) {
    auto task = std::make_shared<std::packaged_task<R()>>(std::move(fn));
    std::future<R> result = task->get_future();
    // The queue holds the only reference: a task that Shutdown() drops is
    // destroyed there, which breaks its promise and ends the wait below.
    if (!Post([task = std::move(task)] { (*task)(); })) return fallback;
    try {
      return result.get();
    } catch (const std::future_error&) {  // dropped by Shutdown()
      return fallback;
    }
  }

  // Idempotent: finishes the running task, drops queued ones, joins.
  void Shutdown();

 private:
  bool Post(std::function<void()> task);
  void Loop();

  std::mutex mu_;  // guards queue_ and stopped_
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stopped_ = false;
  std::thread thread_;
};

}  // namespace conveyor
