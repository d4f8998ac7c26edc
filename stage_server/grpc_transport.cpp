#include "stage_server/grpc_transport.h"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "common/logging.h"
#include "common/net.h"
#include "conveyor.grpc.pb.h"

namespace conveyor {
namespace {

// One stream to one neighbour. Frames are written in Send() order.
class Link {
 public:
  Link(std::string address, std::string label) : address_(std::move(address)), label_(std::move(label)) {}
  ~Link() { Shutdown(); }
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;

  Status Open(std::chrono::system_clock::time_point deadline) {
    channel_ = MakeChannel(address_);
    CONVEYOR_RETURN_IF_ERROR(WaitConnected(*channel_, label_, address_, deadline));
    stub_ = v1::StageData::NewStub(channel_);
    writer_ = stub_->Push(&context_, &reply_);
    if (!writer_) return absl::UnavailableError("cannot open a stream to " + label_ + " at " + address_);
    thread_ = std::thread([this] { Loop(); });
    return absl::OkStatus();
  }

  Status Send(v1::TensorFrame frame) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!error_.ok()) return error_;
      if (closing_) return absl::CancelledError("link to " + label_ + " is closed");
      queue_.push_back(std::move(frame));
    }
    cv_.notify_one();
    return absl::OkStatus();
  }

  void Shutdown() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closing_) return;
      closing_ = true;
      queue_.clear();
    }
    cv_.notify_one();
    context_.TryCancel();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void Loop() {
    for (;;) {
      v1::TensorFrame frame;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return closing_ || !queue_.empty(); });
        if (closing_) break;
        frame = std::move(queue_.front());
        queue_.pop_front();
      }
      if (!writer_->Write(frame)) {
        Status st = FromGrpc(writer_->Finish());
        if (st.ok()) st = absl::UnavailableError("stream closed");
        st = Annotate(st, "link to " + label_ + " at " + address_ + " broke");
        LOG_WARN(st.message());
        std::lock_guard<std::mutex> lock(mu_);
        error_ = st;
        queue_.clear();
        return;
      }
    }
    writer_->WritesDone();
    writer_->Finish();
  }

  const std::string address_;
  const std::string label_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::StageData::Stub> stub_;
  grpc::ClientContext context_;
  v1::PushReply reply_;
  std::unique_ptr<grpc::ClientWriter<v1::TensorFrame>> writer_;

  std::mutex mu_;  // guards queue_, closing_, error_
  std::condition_variable cv_;
  std::deque<v1::TensorFrame> queue_;
  bool closing_ = false;
  Status error_;
  std::thread thread_;
};

class GrpcTransport : public Transport {
 public:
  Status Send(Peer peer, v1::TensorFrame frame) override {
    Link* link = peer == Peer::kUpstream ? up_.get() : down_.get();
    if (!link) return absl::FailedPreconditionError("no neighbour on that side");
    return link->Send(std::move(frame));
  }
  std::string Name() const override { return "grpc"; }
  void Shutdown() override {
    if (up_) up_->Shutdown();
    if (down_) down_->Shutdown();
  }
  ~GrpcTransport() override { Shutdown(); }

  std::unique_ptr<Link> up_, down_;
};

}  // namespace

StatusOr<std::unique_ptr<Transport>> GrpcTransportFactory::Connect(const v1::StageAssignment& a,
                                                                   std::chrono::steady_clock::time_point deadline) {
  auto sys_deadline = std::chrono::system_clock::now() +
                      std::chrono::duration_cast<std::chrono::system_clock::duration>(
                          deadline - std::chrono::steady_clock::now());
  auto t = std::make_unique<GrpcTransport>();
  const int s = a.stage_index();
  if (!a.upstream().empty()) {
    t->up_ = std::make_unique<Link>(a.upstream(), "stage " + std::to_string(s - 1));
    CONVEYOR_RETURN_IF_ERROR(t->up_->Open(sys_deadline));
  }
  if (!a.downstream().empty()) {
    t->down_ = std::make_unique<Link>(a.downstream(), "stage " + std::to_string(s + 1));
    CONVEYOR_RETURN_IF_ERROR(t->down_->Open(sys_deadline));
  }
  return std::unique_ptr<Transport>(std::move(t));
}

}  // namespace conveyor
