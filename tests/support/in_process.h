// An in-process pipeline for tests: P Stages joined by an InProcFabric (the
// in-memory transport), and StageClients that call them directly, so a real
// Coordinator drives them with no gRPC in between.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "coordinator/coordinator.h"
#include "transport/delayed_transport.h"
#include "transport/inproc_transport.h"
#include "stage_server/stage.h"

namespace conveyor::testing {

class InProcessCluster {
 public:
  // With `delay`, every tensor is handed on after a delay drawn per frame.
  // `devices`: one per stage (default: all on the CPU).
  explicit InProcessCluster(int stages, DelayedTransportFactory::Delay delay = nullptr,
                            std::vector<std::string> devices = {});
  ~InProcessCluster();

  int size() const { return static_cast<int>(stages_.size()); }
  Stage& stage(int i) { return *stages_[i]; }
  const std::vector<std::string>& addresses() const { return addresses_; }
  InProcFabric& fabric() { return fabric_; }

  // A coordinator over these stages, jobs kept in memory.
  std::unique_ptr<Coordinator> StartCoordinator(const std::string& state_dir = "");

  // Final parameters of `job_id`, in model order, gathered from the stages.
  std::vector<std::pair<std::string, at::Tensor>> Parameters(const std::string& job_id, int stages);

 private:
  InProcFabric fabric_;
  std::unique_ptr<TransportFactory> delayed_;
  std::vector<std::string> addresses_;
  std::vector<std::unique_ptr<Stage>> stages_;
};

// Puts parameters named "<layer>.<name>" into model order.
void SortByLayer(std::vector<std::pair<std::string, at::Tensor>>* params);

// Submits `yaml` and waits, on the coordinator's change notifications, until
// the job ends (or `timeout_s` passes: the status then is still RUNNING).
v1::JobStatus RunToEnd(Coordinator& coordinator, const std::string& yaml, double timeout_s = 300);
// Job `job_id`'s status once it ended (or at the timeout).
v1::JobStatus WaitForEnd(Coordinator& coordinator, const std::string& job_id, double timeout_s = 300);

}  // namespace conveyor::testing
