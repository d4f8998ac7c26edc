#include "coordinator/stage_client.h"

#include <atomic>
#include <cstdio>
#include <mutex>
#include <set>

#include "common/net.h"
#include "conveyor.grpc.pb.h"

namespace conveyor {
namespace {

std::string FormatSeconds(double s) {
  char text[32];
  std::snprintf(text, sizeof text, "%g s", s);
  return text;
}

class GrpcStageClient : public StageClient {
 public:
  explicit GrpcStageClient(const std::string& address) : address_(address) { Connect(); }

  const std::string& address() const override { return address_; }

#define CONVEYOR_STAGE_GRPC_CALL(Name, Request, Reply, Thread, How)             \
  StatusOr<Reply> Name(const Request& request, double timeout_s) override {       \
    return Invoke(&v1::StageControl::Stub::Name, request, timeout_s, CallKind::How); \
  }
  CONVEYOR_STAGE_CONTROL_OPS(CONVEYOR_STAGE_GRPC_CALL)
#undef CONVEYOR_STAGE_GRPC_CALL
  StatusOr<v1::StageInfo> Ping(double t) override {
    return Invoke(&v1::StageControl::Stub::GetInfo, v1::Empty(), t, CallKind::kFailFast);
  }
  void Reconnect() override {
    std::lock_guard<std::mutex> lock(stub_mu_);
    if (channel_->GetState(/*try_to_connect=*/false) != GRPC_CHANNEL_READY) Connect();
  }
  void CancelSteps() override {
    std::lock_guard<std::mutex> lock(mu_);
    for (grpc::ClientContext* ctx : steps_) ctx->TryCancel();
  }

 private:
  // kWaitForReady waits for a connection that is still coming up, within the
  // deadline. kFailFast fails at once when the stage is unreachable: an abort
  // must not wait for a dead stage, nor a step (its neighbours would wait for
  // it); kStep calls can also be cancelled by CancelSteps().
  enum class CallKind { kWaitForReady, kFailFast, kStep };

  template <typename Req, typename Reply>
  StatusOr<Reply> Invoke(grpc::Status (v1::StageControl::Stub::*method)(grpc::ClientContext*, const Req&, Reply*),
                         const Req& req, double timeout_s, CallKind kind) {
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineAfter(timeout_s));
    ctx.set_wait_for_ready(kind == CallKind::kWaitForReady);
    const bool step = kind == CallKind::kStep;
    if (step) {
      std::lock_guard<std::mutex> lock(mu_);
      steps_.insert(&ctx);
    }
    std::shared_ptr<v1::StageControl::Stub> stub;
    {
      std::lock_guard<std::mutex> lock(stub_mu_);
      stub = stub_;  // calls in flight keep the channel they started on
    }
    Reply reply;
    grpc::Status st = (stub.get()->*method)(&ctx, req, &reply);
    if (step) {
      std::lock_guard<std::mutex> lock(mu_);
      steps_.erase(&ctx);
    }
    if (st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED && !connected_once_) {
      return absl::UnavailableError(address_ + " did not answer within " + FormatSeconds(timeout_s));
    }
    // gRPC's "failed to connect to all addresses; last error: ..." in words.
    if (st.error_code() == grpc::StatusCode::UNAVAILABLE &&
        st.error_message().find("failed to connect") != std::string::npos) {
      return absl::UnavailableError(address_ + " is unreachable: " + DescribeUnreachable(st.error_message()));
    }
    if (!st.ok()) return FromGrpc(st);
    connected_once_ = true;
    return reply;
  }

  // REQUIRES: stub_mu_ held, or the constructor.
  void Connect() {
    channel_ = MakeChannel(address_);
    stub_ = v1::StageControl::NewStub(channel_);
  }

  const std::string address_;
  std::mutex stub_mu_;  // guards channel_ and stub_, replaced by Reconnect()
  std::shared_ptr<grpc::Channel> channel_;
  std::shared_ptr<v1::StageControl::Stub> stub_;
  std::atomic<bool> connected_once_{false};
  std::mutex mu_;  // guards steps_
  std::set<grpc::ClientContext*> steps_;
};

}  // namespace

std::unique_ptr<StageClient> MakeGrpcStageClient(const std::string& address) {
  return std::make_unique<GrpcStageClient>(address);
}

Status ForStage(const Status& st, int64_t stage) {
  if (st.ok()) return st;
  const std::string who = "stage " + std::to_string(stage);
  const auto m = st.message();
  if (m.substr(0, who.size()) == who && m.size() > who.size() && (m[who.size()] == ':' || m[who.size()] == ' '))
    return st;
  return Annotate(st, who);
}

}  // namespace conveyor
