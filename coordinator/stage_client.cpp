#include "coordinator/stage_client.h"

#include <atomic>

#include "common/net.h"
#include "conveyor.grpc.pb.h"

namespace conveyor {
namespace {

class GrpcStageClient : public StageClient {
 public:
  explicit GrpcStageClient(const std::string& address)
      : address_(address), stub_(v1::StageControl::NewStub(MakeChannel(address))) {}

  const std::string& address() const override { return address_; }

  StatusOr<v1::StageInfo> GetInfo(double t) override {
    return Call(&v1::StageControl::Stub::GetInfo, v1::Empty(), t);
  }
  StatusOr<v1::ProfileReply> Profile(const v1::ProfileRequest& req, double t) override {
    return Call(&v1::StageControl::Stub::Profile, req, t);
  }
  StatusOr<v1::ProbeReply> Probe(const v1::ProbeRequest& req, double t) override {
    return Call(&v1::StageControl::Stub::Probe, req, t);
  }
  StatusOr<v1::ConfigureReply> Configure(const v1::StageAssignment& req, double t) override {
    return Call(&v1::StageControl::Stub::Configure, req, t);
  }
  StatusOr<v1::LinkSetup> PrepareLink(const v1::JobRef& req, double t) override {
    return Call(&v1::StageControl::Stub::PrepareLink, req, t);
  }
  StatusOr<v1::ConnectReply> Connect(const v1::JobRef& req, double t) override {
    return Call(&v1::StageControl::Stub::Connect, req, t);
  }
  StatusOr<v1::RunStepReply> RunStep(const v1::RunStepRequest& req, double t) override {
    return Call(&v1::StageControl::Stub::RunStep, req, t);
  }
  StatusOr<v1::DigestReply> GetDigest(const v1::JobRef& req, double t) override {
    return Call(&v1::StageControl::Stub::GetDigest, req, t);
  }
  Status Abort(const v1::AbortRequest& req, double t) override {
    return Call(&v1::StageControl::Stub::Abort, req, t).status();
  }
  Status Release(const v1::JobRef& req, double t) override {
    return Call(&v1::StageControl::Stub::Release, req, t).status();
  }

 private:
  template <typename Req, typename Reply>
  StatusOr<Reply> Call(grpc::Status (v1::StageControl::Stub::*method)(grpc::ClientContext*, const Req&, Reply*),
                       const Req& req, double timeout_s) {
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineAfter(timeout_s));
    // Wait for a connection that is still coming up, within the deadline.
    ctx.set_wait_for_ready(true);
    Reply reply;
    grpc::Status st = (stub_.get()->*method)(&ctx, req, &reply);
    if (st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED && !connected_once_) {
      return absl::UnavailableError("stage at " + address_ + " did not answer within " +
                                    std::to_string(static_cast<int>(timeout_s)) + " s");
    }
    if (!st.ok()) return FromGrpc(st);
    connected_once_ = true;
    return reply;
  }

  const std::string address_;
  std::unique_ptr<v1::StageControl::Stub> stub_;
  std::atomic<bool> connected_once_{false};
};

}  // namespace

std::unique_ptr<StageClient> MakeGrpcStageClient(const std::string& address) {
  return std::make_unique<GrpcStageClient>(address);
}

}  // namespace conveyor
