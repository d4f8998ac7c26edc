#include "transport/delayed_transport.h"

#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "common/logging.h"

namespace conveyor {
namespace {

using Clock = std::chrono::steady_clock;

class DelayedTransport : public Transport {
 public:
  DelayedTransport(std::unique_ptr<Transport> inner, DelayedTransportFactory::Delay delay)
      : inner_(std::move(inner)), delay_(std::move(delay)), thread_([this] { Loop(); }) {}
  ~DelayedTransport() override { Shutdown(); }

  Status Send(Peer peer, Frame frame) override {
    const Clock::time_point due = Clock::now() + delay_();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return absl::CancelledError("transport closed");
      pending_.emplace(due, std::make_pair(peer, std::move(frame)));
    }
    cv_.notify_one();
    return absl::OkStatus();
  }
  v1::LinkKind Kind(Peer peer) const override { return inner_->Kind(peer); }
  Status status() const override { return inner_->status(); }
  void Shutdown() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
    inner_->Shutdown();
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      if (pending_.empty()) {
        cv_.wait(lock);
        continue;
      }
      auto first = pending_.begin();
      if (Clock::now() < first->first) {
        cv_.wait_until(lock, first->first);
        continue;
      }
      auto [peer, frame] = std::move(first->second);
      pending_.erase(first);
      lock.unlock();
      Status st = inner_->Send(peer, std::move(frame));
      if (!st.ok()) LOG_WARN("delayed send failed: ", st.message());
      lock.lock();
    }
  }

  std::unique_ptr<Transport> inner_;
  DelayedTransportFactory::Delay delay_;
  std::mutex mu_;  // guards pending_ and stop_
  std::condition_variable cv_;
  std::multimap<Clock::time_point, std::pair<Peer, Frame>> pending_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace

StatusOr<std::unique_ptr<Transport>> DelayedTransportFactory::Connect(const v1::StageAssignment& assignment,
                                                                      const LinkOptions& options,
                                                                      Clock::time_point deadline) {
  CONVEYOR_ASSIGN_OR_RETURN(std::unique_ptr<Transport> inner, inner_->Connect(assignment, options, deadline));
  return std::unique_ptr<Transport>(new DelayedTransport(std::move(inner), delay_));
}

}  // namespace conveyor
