#include "tests/support/in_process.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "plan/job_spec.h"
#include "transport/tensor_codec.h"

namespace conveyor::testing {
namespace {

class InProcessStageClient : public StageClient {
 public:
  InProcessStageClient(Stage* stage, std::string address) : stage_(stage), address_(std::move(address)) {}
  const std::string& address() const override { return address_; }
#define CONVEYOR_STAGE_IN_PROCESS(Name, Request, Reply, Thread, How) \
  StatusOr<Reply> Name(const Request& request, double) override { return stage_->Name(request); }
  CONVEYOR_STAGE_CONTROL_OPS(CONVEYOR_STAGE_IN_PROCESS)
#undef CONVEYOR_STAGE_IN_PROCESS

 private:
  Stage* stage_;
  std::string address_;
};

}  // namespace

InProcessCluster::InProcessCluster(int stages, DelayedTransportFactory::Delay delay,
                                   std::vector<std::string> devices) {
  if (delay) delayed_ = std::make_unique<DelayedTransportFactory>(&fabric_, std::move(delay));
  for (int i = 0; i < stages; ++i) {
    StageOptions options;
    if (i < static_cast<int>(devices.size())) options.device = devices[i];
    options.transports = delayed_ ? delayed_.get() : &fabric_;
    auto stage = Stage::Create(options);
    EXPECT_TRUE(stage.ok()) << stage.status();
    addresses_.push_back("inproc://" + std::to_string(i));
    fabric_.Register(addresses_.back(), &(*stage)->inbox());
    stages_.push_back(std::move(*stage));
  }
}

InProcessCluster::~InProcessCluster() {
  for (auto& s : stages_) s->Shutdown();
}

std::unique_ptr<Coordinator> InProcessCluster::StartCoordinator(const std::string& state_dir) {
  CoordinatorOptions options;
  options.stages = addresses_;
  options.state_dir = state_dir;
  std::map<std::string, Stage*> by_address;
  for (int i = 0; i < size(); ++i) by_address[addresses_[i]] = stages_[i].get();
  options.client_factory = [by_address](const std::string& address) -> std::unique_ptr<StageClient> {
    return std::make_unique<InProcessStageClient>(by_address.at(address), address);
  };
  auto c = Coordinator::Start(options);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(*c) : nullptr;
}

std::vector<std::pair<std::string, at::Tensor>> InProcessCluster::Parameters(const std::string& job_id, int stages) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  v1::JobRef ref;
  ref.set_job_id(job_id);
  for (int i = 0; i < stages; ++i) {
    auto reply = stages_[i]->GetParameters(ref);
    EXPECT_TRUE(reply.ok()) << reply.status();
    if (!reply.ok()) continue;
    for (auto& p : *reply->mutable_parameters()) out.emplace_back(p.name(), DecodeTensor(p.mutable_tensor()));
  }
  SortByLayer(&out);
  return out;
}

void SortByLayer(std::vector<std::pair<std::string, at::Tensor>>* params) {
  // Names are "<model layer index>.<parameter>"; stages hold chunks out of
  // model order with the interleaved schedule.
  std::stable_sort(params->begin(), params->end(), [](const auto& a, const auto& b) {
    return std::stoi(a.first) < std::stoi(b.first);
  });
}

v1::JobStatus RunToEnd(Coordinator& coordinator, const std::string& yaml, double timeout_s) {
  auto id = coordinator.Submit(yaml);
  EXPECT_TRUE(id.ok()) << id.status();
  if (!id.ok()) return v1::JobStatus();
  return WaitForEnd(coordinator, *id, timeout_s);
}

v1::JobStatus WaitForEnd(Coordinator& coordinator, const std::string& job_id, double timeout_s) {
  const std::string* id = &job_id;
  auto deadline = std::chrono::steady_clock::now() +
                  std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(timeout_s));
  uint64_t version = 0;
  for (;;) {
    auto status = coordinator.Watch(*id, &version, deadline, false);
    EXPECT_TRUE(status.ok()) << status.status();
    if (!status.ok() || IsTerminal(status->state()) || std::chrono::steady_clock::now() >= deadline)
      return status.ok() ? *status : v1::JobStatus();
  }
}

}  // namespace conveyor::testing
