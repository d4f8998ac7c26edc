// A queue of work items for one consumer thread, that producers can no longer
// feed once it is closed or failed: the links' sending threads and the NCCL
// fetchers take their frames from one.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <string>

#include "common/status.h"

namespace conveyor {

// Thread-safe.
template <typename T>
class WorkQueue {
 public:
  // `what` names the queue's owner in errors ("link to stage 1").
  explicit WorkQueue(std::string what) : what_(std::move(what)) {}

  // The failure, or CANCELLED once closed; the item is dropped then.
  Status Push(T item) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!error_.ok()) return error_;
      if (closed_) return absl::CancelledError(what_ + " is closed");
      items_.push_back(std::move(item));
    }
    cv_.notify_one();
    return absl::OkStatus();
  }

  // Ends the consumer's current (or next) wait without an item: it has
  // other work to look at.
  void Wake() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      woken_ = true;
    }
    cv_.notify_one();
  }

  // The oldest item, waiting for one at most `wait` (forever if nullopt);
  // nullopt after the wait, a Wake() or once closed (closed() tells).
  std::optional<T> Pop(std::optional<std::chrono::microseconds> wait) {
    std::unique_lock<std::mutex> lock(mu_);
    auto ready = [this] { return closed_ || woken_ || !items_.empty(); };
    if (wait) {
      cv_.wait_for(lock, *wait, ready);
    } else {
      cv_.wait(lock, ready);
    }
    woken_ = false;
    if (closed_ || items_.empty()) return std::nullopt;
    T item = std::move(items_.front());
    items_.pop_front();
    return item;
  }

  // Drops the queued items and wakes the consumer; false if already closed.
  bool Close() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_) return false;
      closed_ = true;
      items_.clear();
    }
    cv_.notify_all();
    return true;
  }

  // From now on Push() returns `why`; drops the queued items.
  void Fail(const Status& why) {
    std::lock_guard<std::mutex> lock(mu_);
    if (error_.ok()) error_ = why;
    items_.clear();
  }

  bool closed() const {
    std::lock_guard<std::mutex> lock(mu_);
    return closed_;
  }
  Status error() const {
    std::lock_guard<std::mutex> lock(mu_);
    return error_;
  }

 private:
  const std::string what_;
  mutable std::mutex mu_;  // guards everything below
  std::condition_variable cv_;
  std::deque<T> items_;
  bool closed_ = false;
  bool woken_ = false;
  Status error_;
};

}  // namespace conveyor
