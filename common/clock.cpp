#include "common/clock.h"

#include <algorithm>

namespace conveyor {
namespace {

class SteadyClockImpl final : public Clock {
 public:
  TimePoint Now() const override { return std::chrono::steady_clock::now(); }
  bool WaitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock, TimePoint deadline,
                 const std::function<bool()>& done) override {
    return cv.wait_until(lock, deadline, done);
  }
};

}  // namespace

Clock& RealClock() {
  static SteadyClockImpl* clock = new SteadyClockImpl();  // never destroyed: used until exit
  return *clock;
}

FakeClock::FakeClock(TimePoint start) : now_ns_(std::chrono::nanoseconds(start.time_since_epoch()).count()) {}

Clock::TimePoint FakeClock::Now() const {
  return TimePoint(std::chrono::duration_cast<Duration>(std::chrono::nanoseconds(now_ns_.load())));
}

bool FakeClock::WaitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock, TimePoint deadline,
                          const std::function<bool()>& done) {
  Waiter self{&cv, lock.mutex()};
  // mu_ is taken with the caller's mutex unlocked (see the lock order). What
  // Advance() does meanwhile is seen below: the time is read after this.
  lock.unlock();
  {
    std::lock_guard<std::mutex> guard(mu_);
    waiters_.push_back(&self);
  }
  waiters_changed_.notify_all();
  lock.lock();
  // Advance() changes the time, then notifies under the caller's mutex: a
  // check made before it is followed by a wait that its notify ends.
  while (!done() && Now() < deadline) cv.wait(lock);
  lock.unlock();
  {
    std::lock_guard<std::mutex> guard(mu_);
    waiters_.erase(std::find(waiters_.begin(), waiters_.end(), &self));
  }
  waiters_changed_.notify_all();
  lock.lock();
  return done();
}

void FakeClock::Advance(Duration by) {
  now_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(by).count();
  std::lock_guard<std::mutex> guard(mu_);  // waiters stay registered while notified
  for (Waiter* w : waiters_) {
    std::lock_guard<std::mutex> lock(*w->mu);
    w->cv->notify_all();
  }
}

bool FakeClock::AwaitWaiters(int n, std::chrono::milliseconds real_timeout) {
  std::unique_lock<std::mutex> guard(mu_);
  return waiters_changed_.wait_for(guard, real_timeout, [&] { return static_cast<int>(waiters_.size()) >= n; });
}

}  // namespace conveyor
