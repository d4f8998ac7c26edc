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
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <map>
#include <utility>

#include "common/clock.h"
#include "stage_server/flat_views.h"
#include "transport/nccl/nccl_channel.h"
#include "transport/nccl/nccl_group.h"

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
  c10::intrusive_ptr<c10d::TCPStore> store;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group;
  std::shared_ptr<NcclGroup> nccl;  // options.nccl: CUDA tensors (a Watcher keeps it)
  // The end times of the device collectives that Confirm has not seen done.
  std::vector<std::shared_ptr<std::atomic<int64_t>>> pending_ends;
};

namespace {

// 1.13's allreduce returns a ProcessGroup::Work, 2.x's a c10d::Work.
using C10dWork = decltype(std::declval<c10d::ProcessGroupGloo&>().allreduce(std::declval<std::vector<at::Tensor>&>()));

// Runs `collective` (a Status of the flat tensor) on one flat copy of each
// dtype's tensors, then copies the result back into them (on a dtype's only
// tensor, where it is flat, in place); stops at the first error.
template <typename Collective>
Status OnFlatBuffers(std::vector<at::Tensor>& tensors, Collective collective) {
  for (auto& [key, members] : ByDtypeAndDevice(tensors)) {
    if (members.size() == 1 && tensors[members[0]].dim() == 1 && tensors[members[0]].is_contiguous()) {
      CONVEYOR_RETURN_IF_ERROR(collective(tensors[members[0]]));  // flat already: in place
      continue;
    }
    std::vector<at::Tensor> parts;
    for (std::size_t i : members) parts.push_back(tensors[i].reshape({-1}));
    at::Tensor flat = at::cat(parts);
    CONVEYOR_RETURN_IF_ERROR(collective(flat));
    int64_t offset = 0;
    for (std::size_t i : members) {
      const int64_t n = tensors[i].numel();
      tensors[i].copy_(flat.narrow(0, offset, n).view_as(tensors[i]));
      offset += n;
    }
  }
  return absl::OkStatus();
}

}  // namespace

Status ReplicaGroup::Failure(const std::string& what, const std::exception& e) {
  impl_.reset();  // the next collective joins anew
  const std::string who = options_.who + " (" + what + " over " + std::to_string(options_.size) + " replicas)";
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  const std::string message = c10_error ? c10_error->what_without_backtrace() : e.what();
  if (message.find("imeout") != std::string::npos || message.find("imed out") != std::string::npos)
    return absl::DeadlineExceededError(who + ": a replica did not take part within stage_timeout: " + message);
  return absl::UnavailableError(who + ": " + message);
}

Status ReplicaGroup::Join() {
  if (impl_) return absl::OkStatus();
  try {
    const auto colon = options_.store.rfind(':');
    if (colon == std::string::npos)
      return absl::InvalidArgumentError(options_.who + ": bad store address '" + options_.store + "'");
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
    impl->store = tcp;
    impl_ = std::move(impl);
  } catch (const std::exception& e) {
    return Failure("joining the group", e);
  }
  if (options_.nccl) {
    Status joined = JoinNccl();
    if (!joined.ok()) {
      impl_.reset();
      return joined;
    }
  }
  return absl::OkStatus();
}

Status ReplicaGroup::JoinNccl() {
  // Replica 0 makes the communicator's id and leaves it in the store; each
  // join of this group object takes a key of its own.
  const std::string key = "conveyor/nccl/" + std::to_string(nccl_joins_++);
  std::string id;
  try {
    if (options_.rank == 0) {
      CONVEYOR_ASSIGN_OR_RETURN(id, NewNcclUniqueId());
      impl_->store->set(key, std::vector<uint8_t>(id.begin(), id.end()));
    } else {
      const std::vector<uint8_t> bytes = impl_->store->get(key);
      id.assign(bytes.begin(), bytes.end());
    }
  } catch (const std::exception& e) {
    return Failure("sharing the NCCL group's id", e);
  }
  auto nccl = NcclGroup::Join(id, options_.rank, options_.size, options_.device, options_.timeout,
                              options_.who + " (NCCL over " + std::to_string(options_.size) + " replicas)");
  if (!nccl.ok()) return nccl.status();
  impl_->nccl = std::move(*nccl);
  return absl::OkStatus();
}

namespace {

// A sum through Gloo on the host; `then` runs once it is done (a widened
// bucket's copy back).
class GlooWork : public ReplicaGroup::Work {
 public:
  GlooWork(C10dWork work, std::chrono::milliseconds timeout, std::function<Status(const std::exception&)> failure,
           std::function<void()> then = nullptr)
      : work_(std::move(work)),
        timeout_(timeout),
        failure_(std::move(failure)),
        then_(std::move(then)),
        start_us_(UnixMicros()) {
    try {  // the time it is done, from c10d's thread
      auto end = end_us_;
      work_->getFuture()->addCallback([end](c10::ivalue::Future&) { end->store(UnixMicros()); });
    } catch (const std::exception&) {
      // No future: the time Wait returns.
    }
  }
  Status Wait() override {
    try {
      work_->wait(timeout_);
      if (then_) then_();
    } catch (const std::exception& e) {
      return failure_(e);
    }
    int64_t expected = 0;
    end_us_->compare_exchange_strong(expected, UnixMicros());
    return absl::OkStatus();
  }
  int64_t start_us() const override { return start_us_; }
  int64_t end_us() const override { return end_us_->load(); }

 private:
  C10dWork work_;
  std::chrono::milliseconds timeout_;
  std::function<Status(const std::exception&)> failure_;
  std::function<void()> then_;
  int64_t start_us_;
  std::shared_ptr<std::atomic<int64_t>> end_us_ = std::make_shared<std::atomic<int64_t>>(0);
};

// A sum on the device (NCCL): Wait makes the caller's stream wait for it;
// its end is when ReplicaGroup::Confirm saw it done.
class DeviceWork : public ReplicaGroup::Work {
 public:
  DeviceWork(c10::Event done, std::shared_ptr<std::atomic<int64_t>> end_us)
      : done_(std::move(done)), start_us_(UnixMicros()), end_us_(std::move(end_us)) {}
  Status Wait() override {
    const c10::Device device(c10::DeviceType::CUDA, done_.device_index());
    done_.block(c10::impl::VirtualGuardImpl(c10::DeviceType::CUDA).getStream(device));
    return absl::OkStatus();
  }
  int64_t start_us() const override { return start_us_; }
  int64_t end_us() const override { return end_us_->load(); }

 private:
  c10::Event done_;
  int64_t start_us_;
  std::shared_ptr<std::atomic<int64_t>> end_us_;
};

}  // namespace

Status ReplicaGroup::Confirm() {
  if (!impl_ || !impl_->nccl) return absl::OkStatus();
  // Deferred: the step's end waits for them (Watcher); only a failure so far.
  Status st = defer_confirm_ ? impl_->nccl->Poll(absl::OkStatus()) : impl_->nccl->Synchronize(options_.interrupted);
  if (!st.ok()) {
    impl_.reset();  // the next collective joins anew
    return st;
  }
  if (defer_confirm_) return absl::OkStatus();
  const int64_t now = UnixMicros();
  for (auto& end : impl_->pending_ends) end->store(now);
  impl_->pending_ends.clear();
  return absl::OkStatus();
}

std::function<Status(const Status&)> ReplicaGroup::Watcher() {
  if (!impl_ || !impl_->nccl) return nullptr;
  return [nccl = impl_->nccl](const Status& stop) { return nccl->Poll(stop); };
}

StatusOr<std::unique_ptr<ReplicaGroup::Work>> ReplicaGroup::OnDevice(StatusOr<c10::Event> done) {
  if (!done.ok()) {
    impl_.reset();
    return done.status();
  }
  auto end = std::make_shared<std::atomic<int64_t>>(0);
  if (!defer_confirm_) impl_->pending_ends.push_back(end);
  return std::unique_ptr<Work>(new DeviceWork(std::move(*done), std::move(end)));
}

StatusOr<std::unique_ptr<ReplicaGroup::Work>> ReplicaGroup::StartAllReduce(at::Tensor flat) {
  CONVEYOR_RETURN_IF_ERROR(Join());
  if (impl_->nccl && flat.is_cuda()) return OnDevice(impl_->nccl->AllReduce(std::move(flat)));
  try {
    // Gloo has no bfloat16 sum (LibTorch 1.13: "Invalid scalar type"): such a
    // bucket is summed in float and rounded back to bfloat16 once.
    const bool widen = flat.scalar_type() == at::kBFloat16;
    std::vector<at::Tensor> one{widen ? flat.to(at::kFloat) : flat};
    std::function<void()> then;
    if (widen) then = [flat, wide = one[0]]() mutable { flat.copy_(wide); };
    C10dWork work = impl_->group->allreduce(one);
    return std::unique_ptr<Work>(new GlooWork(
        std::move(work), options_.timeout, [this](const std::exception& e) { return Failure("all-reduce", e); },
        std::move(then)));
  } catch (const std::exception& e) {
    return Failure("all-reduce", e);
  }
}

StatusOr<std::unique_ptr<ReplicaGroup::Work>> ReplicaGroup::StartReduceScatter(at::Tensor flat) {
  CONVEYOR_RETURN_IF_ERROR(Join());
  if (flat.dim() != 1 || flat.numel() % options_.size != 0)
    return absl::InvalidArgumentError(options_.who + ": reduce-scatter of " + std::to_string(flat.numel()) +
                                      " elements in " + std::to_string(options_.size) + " equal slices");
  if (!(impl_->nccl && flat.is_cuda())) return StartAllReduce(std::move(flat));
  const int64_t n = flat.numel() / options_.size;
  return OnDevice(impl_->nccl->ReduceScatter(flat, flat.narrow(0, n * options_.rank, n)));  // in place
}

Status ReplicaGroup::AllGather(const std::vector<at::Tensor>& flats) {
  CONVEYOR_RETURN_IF_ERROR(Join());
  for (const at::Tensor& flat : flats) {
    if (flat.dim() != 1 || flat.numel() % options_.size != 0)
      return absl::InvalidArgumentError(options_.who + ": all-gather of " + std::to_string(flat.numel()) +
                                        " elements in " + std::to_string(options_.size) + " equal slices");
  }
  try {
    for (const at::Tensor& flat : flats) {
      const int64_t n = flat.numel() / options_.size;
      if (impl_->nccl && flat.is_cuda()) {  // in place; the work after it waits on the device
        CONVEYOR_ASSIGN_OR_RETURN(std::unique_ptr<Work> work,
                                  OnDevice(impl_->nccl->AllGather(flat.narrow(0, n * options_.rank, n), flat)));
        CONVEYOR_RETURN_IF_ERROR(work->Wait());
        continue;
      }
      // Gloo: each member's slice broadcast from it, in place, as bytes (no
      // bfloat16 in 1.13, and nothing is summed). c10d's Gloo all-gather
      // copies its input into a new flat tensor and its output out of one
      // (three copies of the slices): on the CPU over veth pairs (a 38 M-
      // parameter MLP as 2 x 1) that made the step 8% longer than these
      // broadcasts (2-core CPU machine, 2026-11-27, bench/RESULTS.md).
      at::Tensor bytes = flat.view(at::kByte);
      const int64_t b = bytes.numel() / options_.size;
      for (int r = 0; r < options_.size; ++r) {
        c10d::BroadcastOptions o;
        o.rootRank = r;
        std::vector<at::Tensor> slice{bytes.narrow(0, b * r, b)};
        impl_->group->broadcast(slice, o)->wait(options_.timeout);
      }
    }
  } catch (const std::exception& e) {
    return Failure("all-gather", e);
  }
  return Confirm();
}

Status ReplicaGroup::AllReduce(std::vector<at::Tensor>& grads) {
  try {
    CONVEYOR_RETURN_IF_ERROR(OnFlatBuffers(grads, [&](const at::Tensor& flat) -> Status {
      CONVEYOR_ASSIGN_OR_RETURN(std::unique_ptr<Work> work, StartAllReduce(flat));
      return work->Wait();
    }));
  } catch (const std::exception& e) {  // flattening or copying back
    return Failure("all-reduce", e);
  }
  return Confirm();
}

Status ReplicaGroup::Broadcast(std::vector<at::Tensor>& tensors, int root) {
  CONVEYOR_RETURN_IF_ERROR(Join());
  try {
    c10d::BroadcastOptions o;
    o.rootRank = root;
    CONVEYOR_RETURN_IF_ERROR(OnFlatBuffers(tensors, [&](const at::Tensor& flat) -> Status {
      if (impl_->nccl && flat.is_cuda()) {  // on the device; the copies back wait for it there
        CONVEYOR_ASSIGN_OR_RETURN(c10::Event done, impl_->nccl->Broadcast(flat, root));
        return DeviceWork(std::move(done), std::make_shared<std::atomic<int64_t>>(0)).Wait();
      }
      // Gloo has no bfloat16 (LibTorch 1.13): the same bits as bytes.
      std::vector<at::Tensor> one{flat.scalar_type() == at::kBFloat16 ? flat.view(at::kByte) : flat};
      impl_->group->broadcast(one, o)->wait(options_.timeout);
      return absl::OkStatus();
    }));
  } catch (const std::exception& e) {
    return Failure("broadcast", e);
  }
  return Confirm();
}

Status ReplicaGroup::BroadcastBytes(std::string* bytes, int root) {
  CONVEYOR_RETURN_IF_ERROR(Join());
  try {
    c10d::BroadcastOptions o;
    o.rootRank = root;
    const bool sender = options_.rank == root;
    std::vector<at::Tensor> size{at::full({1}, static_cast<int64_t>(sender ? bytes->size() : 0), at::kLong)};
    impl_->group->broadcast(size, o)->wait(options_.timeout);
    const int64_t n = size[0].item<int64_t>();
    if (n < 0) {
      return absl::DataLossError(options_.who + ": replica " + std::to_string(root) + " sent " + std::to_string(n) +
                                 " bytes");
    }
    std::vector<at::Tensor> data{at::empty({n}, at::kByte)};
    if (sender && n > 0) std::memcpy(data[0].data_ptr(), bytes->data(), static_cast<std::size_t>(n));
    if (n > 0) impl_->group->broadcast(data, o)->wait(options_.timeout);
    if (!sender) bytes->assign(static_cast<const char*>(data[0].data_ptr()), static_cast<std::size_t>(n));
  } catch (const std::exception& e) {
    return Failure("broadcast", e);
  }
  return absl::OkStatus();
}

#else  // no Gloo in this build

bool ReplicaGroupsAvailable() { return false; }

StatusOr<std::unique_ptr<ReplicaStore>> ReplicaStore::Serve(std::chrono::milliseconds) {
  return absl::UnimplementedError("replicas: this stage server was built without c10d's Gloo group (libgloo-dev)");
}

struct ReplicaGroup::Impl {};

namespace {
Status NoGloo(const std::string& who) {
  return absl::UnimplementedError(who + ": replicas: this stage server was built without c10d's Gloo group");
}
}  // namespace

Status ReplicaGroup::Join() { return NoGloo(options_.who); }
Status ReplicaGroup::AllReduce(std::vector<at::Tensor>&) { return NoGloo(options_.who); }
StatusOr<std::unique_ptr<ReplicaGroup::Work>> ReplicaGroup::StartAllReduce(at::Tensor) { return NoGloo(options_.who); }
Status ReplicaGroup::Broadcast(std::vector<at::Tensor>&, int) { return NoGloo(options_.who); }
StatusOr<std::unique_ptr<ReplicaGroup::Work>> ReplicaGroup::StartReduceScatter(at::Tensor) {
  return NoGloo(options_.who);
}
Status ReplicaGroup::AllGather(const std::vector<at::Tensor>&) { return NoGloo(options_.who); }
Status ReplicaGroup::BroadcastBytes(std::string*, int) { return NoGloo(options_.who); }
Status ReplicaGroup::Failure(const std::string&, const std::exception& e) { return absl::InternalError(e.what()); }
Status ReplicaGroup::Confirm() { return absl::OkStatus(); }
std::function<Status(const Status&)> ReplicaGroup::Watcher() { return nullptr; }
Status ReplicaGroup::JoinNccl() { return NoGloo(options_.who); }
StatusOr<std::unique_ptr<ReplicaGroup::Work>> ReplicaGroup::OnDevice(StatusOr<c10::Event>) {
  return NoGloo(options_.who);
}

#endif

ReplicaGroup::ReplicaGroup(Options options) : options_(std::move(options)) {}
ReplicaGroup::~ReplicaGroup() = default;

}  // namespace conveyor
