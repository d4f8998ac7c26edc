#include "stage_server/replica_group.h"

// c10d's Gloo headers need this define and gloo's own headers (libgloo-dev);
// a LibTorch without them (a wheel ships no gloo headers) builds the stub.
#if __has_include(<gloo/config.h>) && __has_include(<torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>)
#define CONVEYOR_HAS_GLOO 1
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO 1
#endif
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#endif

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <map>
#include <utility>

namespace conveyor {

#ifdef CONVEYOR_HAS_GLOO

bool ReplicaGroupsAvailable() { return true; }

namespace {

class TcpReplicaStore : public ReplicaStore {
 public:
  explicit TcpReplicaStore(c10::intrusive_ptr<c10d::TCPStore> store) : store_(std::move(store)) {}
  int port() const override { return store_->getPort(); }

 private:
  c10::intrusive_ptr<c10d::TCPStore> store_;
};

}  // namespace

StatusOr<std::unique_ptr<ReplicaStore>> ReplicaStore::Serve(std::chrono::milliseconds timeout) {
  try {
    c10d::TCPStoreOptions o;
    o.port = 0;
    o.isServer = true;
    o.waitWorkers = false;
    o.timeout = std::max(timeout, std::chrono::milliseconds(1000));  // as ReplicaGroup's client
    auto store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", o);  // listens on every interface
    return std::unique_ptr<ReplicaStore>(new TcpReplicaStore(std::move(store)));
  } catch (const std::exception& e) {
    return absl::UnavailableError(std::string("serving the replicas' store: ") + e.what());
  }
}

struct ReplicaGroup::Impl {
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group;
};

Status ReplicaGroup::AllReduce(std::vector<at::Tensor>& grads) {
  const std::string who = options_.who + " (all-reduce over " + std::to_string(options_.size) + " replicas)";
  try {
    if (!impl_) {
      const auto colon = options_.store.rfind(':');
      if (colon == std::string::npos) return absl::InvalidArgumentError(who + ": bad store address '" + options_.store + "'");
      c10d::TCPStoreOptions o;
      o.port = static_cast<uint16_t>(std::stoi(options_.store.substr(colon + 1)));
      o.isServer = false;
      // 1.13's client gives up at once under a second (it counts whole seconds).
      o.timeout = std::max(options_.timeout, std::chrono::milliseconds(1000));
      auto tcp = c10::make_intrusive<c10d::TCPStore>(options_.store.substr(0, colon), o);
      auto gloo_options = c10d::ProcessGroupGloo::Options::create(options_.timeout);
      gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(options_.host));
      auto impl = std::make_unique<Impl>();
      impl->group = c10::make_intrusive<c10d::ProcessGroupGloo>(tcp, options_.rank, options_.size, gloo_options);
      impl_ = std::move(impl);
    }
    // One flat buffer per (dtype, device): one all-reduce each.
    std::map<std::pair<int, std::string>, std::vector<std::size_t>> buckets;
    for (std::size_t i = 0; i < grads.size(); ++i)
      buckets[{static_cast<int>(grads[i].scalar_type()), grads[i].device().str()}].push_back(i);
    for (auto& [key, members] : buckets) {
      std::vector<at::Tensor> parts;
      for (std::size_t i : members) parts.push_back(grads[i].reshape({-1}));
      std::vector<at::Tensor> flat{at::cat(parts)};
      impl_->group->allreduce(flat)->wait(options_.timeout);
      int64_t offset = 0;
      for (std::size_t i : members) {
        const int64_t n = grads[i].numel();
        grads[i].copy_(flat[0].narrow(0, offset, n).view_as(grads[i]));
        offset += n;
      }
    }
  } catch (const std::exception& e) {
    impl_.reset();  // the next step joins anew
    const std::string what = e.what();
    if (what.find("imeout") != std::string::npos || what.find("imed out") != std::string::npos)
      return absl::DeadlineExceededError(who + ": a replica did not take part within stage_timeout: " + what);
    return absl::UnavailableError(who + ": " + what);
  }
  return absl::OkStatus();
}

#else  // no Gloo in this build

bool ReplicaGroupsAvailable() { return false; }

StatusOr<std::unique_ptr<ReplicaStore>> ReplicaStore::Serve(std::chrono::milliseconds) {
  return absl::UnimplementedError("replicas: this stage server was built without c10d's Gloo group (libgloo-dev)");
}

struct ReplicaGroup::Impl {};

Status ReplicaGroup::AllReduce(std::vector<at::Tensor>&) {
  return absl::UnimplementedError(options_.who + ": replicas: this stage server was built without c10d's Gloo group");
}

#endif

ReplicaGroup::ReplicaGroup(Options options) : options_(std::move(options)) {}
ReplicaGroup::~ReplicaGroup() = default;

}  // namespace conveyor
