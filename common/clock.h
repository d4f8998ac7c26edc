// The time timeouts are decided by (the coordinator's deadlines and recovery
// waits, a stage's wait for its neighbours). RealClock() is the steady
// clock; tests inject a FakeClock and advance it, so that a timeout of minutes
// passes in microseconds of real time. Measurements (throughput, ETA, step
// timelines) use std::chrono::steady_clock directly: they decide nothing.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

namespace conveyor {

// Thread-safe.
class Clock {
 public:
  // Time points share the steady clock's type; a fake clock's start where it
  // was told.
  using TimePoint = std::chrono::steady_clock::time_point;
  using Duration = std::chrono::steady_clock::duration;

  virtual ~Clock() = default;
  virtual TimePoint Now() const = 0;
  // cv.wait_until(lock, deadline, done) by this clock: returns when done()
  // holds (true) or Now() reaches `deadline` (done()'s value then).
  // REQUIRES: `lock` holds the mutex that guards what done() reads, and
  // whoever changes it notifies `cv`.
  virtual bool WaitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock, TimePoint deadline,
                         const std::function<bool()>& done) = 0;

  // `seconds` from now.
  TimePoint After(double seconds) const {
    return Now() + std::chrono::duration_cast<Duration>(std::chrono::duration<double>(seconds));
  }
};

// The steady clock; lives as long as the process.
Clock& RealClock();

// Microseconds since the Unix epoch on the system clock: the time stamps of
// step timelines, comparable between the processes of one host.
inline int64_t UnixMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A clock that stands still until Advance(). Waits on it end when their
// condition holds or when Advance() takes the time past their deadline.
class FakeClock final : public Clock {
 public:
  // Starts at `start` (an arbitrary point; only differences matter).
  explicit FakeClock(TimePoint start = TimePoint(std::chrono::hours(1)));
  FakeClock(const FakeClock&) = delete;
  FakeClock& operator=(const FakeClock&) = delete;

  TimePoint Now() const override;
  bool WaitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock, TimePoint deadline,
                 const std::function<bool()>& done) override;

  // Moves the time on and wakes every wait in progress.
  void Advance(Duration by);
  // Blocks until at least `n` waits are in progress, or `real_timeout` of
  // real time passed (false). Lets a test advance the time once the code
  // under test waits on it.
  bool AwaitWaiters(int n, std::chrono::milliseconds real_timeout);

 private:
  struct Waiter {
    std::condition_variable* cv;
    std::mutex* mu;
  };

  std::atomic<int64_t> now_ns_;  // the time, read without mu_
  // Guards waiters_. Lock order: mu_, then a waiter's mutex; a waiter takes
  // mu_ only while its own mutex is unlocked.
  std::mutex mu_;
  std::condition_variable waiters_changed_;
  std::vector<Waiter*> waiters_;
};

}  // namespace conveyor
