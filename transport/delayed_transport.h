// A transport seam for timing noise: wraps another transport and hands each
// frame on after a delay drawn per frame, so frames arrive late and out of
// order. Tests use it to show that no schedule hangs or changes its result
// under timing noise.
#pragma once

#include <chrono>
#include <functional>

#include "transport/transport.h"

namespace conveyor {

class DelayedTransportFactory : public TransportFactory {
 public:
  using Delay = std::function<std::chrono::microseconds()>;  // called from any thread
  // `inner` is not owned and must outlive every transport made here.
  DelayedTransportFactory(TransportFactory* inner, Delay delay) : inner_(inner), delay_(std::move(delay)) {}

  StatusOr<std::unique_ptr<Transport>> Connect(const v1::StageAssignment& assignment, const LinkOptions& options,
                                               std::chrono::steady_clock::time_point deadline) override;
  bool SupportsNccl() const override { return inner_->SupportsNccl(); }
  StatusOr<v1::LinkSetup> PrepareLink(const std::string& device, const NcclOptions& nccl,
                                      std::shared_ptr<PreparedLink>* prepared) override {
    return inner_->PrepareLink(device, nccl, prepared);
  }

 private:
  TransportFactory* inner_;
  Delay delay_;
};

}  // namespace conveyor
