#include "stage_server/stage_metrics.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <mutex>

#include "stage_server/device_info.h"

namespace conveyor {
namespace {

std::string TransportName(v1::LinkKind kind) {
  switch (kind) {
    case v1::LINK_IN_PROCESS:
      return "in_process";
    case v1::LINK_GRPC:
      return "grpc";
    case v1::LINK_NCCL:
      return "nccl";
    default:
      return "none";
  }
}

class CountingTransport final : public Transport {
 public:
  CountingTransport(std::unique_ptr<Transport> inner, const v1::StageAssignment& a)
      : inner_(std::move(inner)), labels_(StageLabels(a.job_id(), a.stage_index(), a.replica())) {}

  Status Send(Peer peer, Frame frame) override {
    const int64_t bytes = frame.payload ? frame.payload->bytes() : 0;
    metrics::Labels labels = labels_;
    labels["peer"] = peer == Peer::kUpstream ? "upstream" : "downstream";
    labels["transport"] = TransportName(inner_->Kind(peer));
    Status st = inner_->Send(peer, std::move(frame));
    if (st.ok()) metrics::Add(metrics::Id::kStageSentBytes, labels, static_cast<double>(bytes));
    return st;
  }
  Status status() const override { return inner_->status(); }
  v1::LinkKind Kind(Peer peer) const override { return inner_->Kind(peer); }
  void Shutdown() override { inner_->Shutdown(); }

 private:
  std::unique_ptr<Transport> inner_;
  const metrics::Labels labels_;
};

class CountingTransportFactory final : public TransportFactory {
 public:
  explicit CountingTransportFactory(TransportFactory* inner) : inner_(inner) {}
  StatusOr<std::unique_ptr<Transport>> Connect(const v1::StageAssignment& assignment, const LinkOptions& options,
                                               std::chrono::steady_clock::time_point deadline) override {
    CONVEYOR_ASSIGN_OR_RETURN(std::unique_ptr<Transport> t, inner_->Connect(assignment, options, deadline));
    return std::unique_ptr<Transport>(new CountingTransport(std::move(t), assignment));
  }
  StatusOr<v1::LinkSetup> PrepareLink(const std::string& device, const NcclOptions& nccl,
                                      std::shared_ptr<PreparedLink>* prepared) override {
    return inner_->PrepareLink(device, nccl, prepared);
  }
  bool SupportsNccl() const override { return inner_->SupportsNccl(); }

 private:
  TransportFactory* inner_;
};

// This process's resident set, from /proc/self/statm.
int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  if (!(statm >> size >> resident)) return -1;
  return resident * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

}  // namespace

metrics::Labels StageLabels(const std::string& job_id, int stage_index, int replica) {
  return {{"job_id", job_id}, {"stage", std::to_string(stage_index)}, {"replica", std::to_string(replica)}};
}

void RecordIdleStage(const std::string& device) {
  metrics::RecordProcess("stage");
  const int64_t memory = DeviceMemoryBytes(device);
  if (memory >= 0) {
    metrics::Set(metrics::Id::kStageDeviceMemoryBytes, {{"stage", ""}, {"replica", ""}, {"device", device}},
                 static_cast<double>(memory));
  }
}

int64_t DeviceMemoryBytes(const std::string& device) {
  if (device.rfind("cuda", 0) == 0) return CudaReservedBytes(device);
  return ResidentBytes();
}

void RecordStageStep(int stage_index, int replica, const std::string& device, const v1::RunStepRequest& req,
                     const v1::RunStepReply& reply) {
  const metrics::Labels labels = StageLabels(req.job_id(), stage_index, replica);
  metrics::Labels phase = labels;
  phase["phase"] = req.phase() == v1::PHASE_EVAL ? "eval" : "train";
  metrics::Add(metrics::Id::kStageSteps, phase);
  metrics::Add(metrics::Id::kStageBusySeconds, labels, reply.busy_seconds());
  metrics::Add(metrics::Id::kStageIdleSeconds, labels, std::max(0.0, reply.step_seconds() - reply.busy_seconds()));
  static std::mutex mu;  // guards peak (RunStep calls of one stage are serial; this keeps it so)
  static std::map<metrics::Labels, int64_t> peak;
  {
    std::lock_guard<std::mutex> lock(mu);
    int64_t& p = peak[labels];
    p = std::max(p, reply.peak_activation_bytes());
    metrics::Set(metrics::Id::kStageActivationPeakBytes, labels, static_cast<double>(p));
  }
  const int64_t memory = DeviceMemoryBytes(device);
  if (memory >= 0) {
    metrics::Forget(metrics::Id::kStageDeviceMemoryBytes, {{"stage", ""}});  // the idle server's
    metrics::Set(metrics::Id::kStageDeviceMemoryBytes,
                 {{"stage", std::to_string(stage_index)}, {"replica", std::to_string(replica)}, {"device", device}},
                 static_cast<double>(memory));
  }
}

std::unique_ptr<TransportFactory> CountingTransports(TransportFactory* inner) {
  return std::make_unique<CountingTransportFactory>(inner);
}

}  // namespace conveyor
