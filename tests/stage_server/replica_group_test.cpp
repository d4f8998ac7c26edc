// The replicas' gradient all-reduce (stage_server/replica_group.h): members
// sum in place, and a member that never comes is an error, not a hang.
#include "stage_server/gradient_reducer.h"
#include "stage_server/replica_group.h"
#include "model/device.h"
#include "transport/nccl/nccl_channel.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <future>

namespace conveyor {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

ReplicaGroup::Options Member(int port, int rank, std::chrono::milliseconds timeout) {
  ReplicaGroup::Options o;
  o.store = "127.0.0.1:" + std::to_string(port);
  o.host = "127.0.0.1";
  o.rank = rank;
  o.size = 2;
  o.timeout = timeout;
  o.who = "stage 0 of replica " + std::to_string(rank);
  return o;
}

TEST(ReplicaGroup, TwoMembersSumTheirGradientsInPlace) {
  if (!ReplicaGroupsAvailable()) GTEST_SKIP() << "built without c10d's Gloo group";
  auto store = ReplicaStore::Serve(10s);
  ASSERT_TRUE(store.ok()) << store.status();
  const int port = (*store)->port();
  ASSERT_GT(port, 0);
  auto run = [port](int rank) {
    ReplicaGroup group(Member(port, rank, 10s));
    // Two dtypes (two buffers) and two steps on the same group.
    std::vector<at::Tensor> grads{at::full({2, 3}, rank + 1.0), at::full({4}, 10.0 * (rank + 1), at::kDouble)};
    Status st = group.AllReduce(grads);
    if (st.ok()) st = group.AllReduce(grads);
    return std::make_pair(st, grads);
  };
  auto other = std::async(std::launch::async, run, 1);
  auto [st0, g0] = run(0);
  auto [st1, g1] = other.get();
  ASSERT_TRUE(st0.ok()) << st0;
  ASSERT_TRUE(st1.ok()) << st1;
  for (const auto& g : {g0, g1}) {
    EXPECT_TRUE(at::equal(g[0], at::full({2, 3}, 6.0)));  // (1 + 2), then doubled
    EXPECT_TRUE(at::equal(g[1], at::full({4}, 60.0, at::kDouble)));
  }
}

TEST(ReplicaGroup, AReplicaThatNeverComesIsAnErrorNamingTheGroup) {
  if (!ReplicaGroupsAvailable()) GTEST_SKIP() << "built without c10d's Gloo group";
  auto store = ReplicaStore::Serve(10s);
  ASSERT_TRUE(store.ok()) << store.status();
  ReplicaGroup alone(Member((*store)->port(), 0, 500ms));
  std::vector<at::Tensor> grads{at::ones({3})};
  const Status st = alone.AllReduce(grads);
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(absl::IsDeadlineExceeded(st) || absl::IsUnavailable(st)) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("stage 0 of replica 0 (joining the group over 2 replicas)")) << st;
  EXPECT_THAT(std::string(st.message()), ::testing::Not(HasSubstr("frame #"))) << "no backtrace: " << st;
  // It reached the store (under a second, 1.13's store client would not) and waited for replica 1.
  EXPECT_THAT(std::string(st.message()), ::testing::Not(HasSubstr("trying to connect"))) << st;
}

// Both members run `body(group)` at once; returns their statuses. `nccl`:
// each sums CUDA tensors with NCCL on cuda:RANK.
template <typename Body>
std::pair<Status, Status> BothMembers(std::chrono::milliseconds timeout, Body body, bool nccl = false,
                                      std::function<Status()> interrupted = nullptr) {
  auto store = ReplicaStore::Serve(10s);
  EXPECT_TRUE(store.ok()) << store.status();
  if (!store.ok()) return {store.status(), store.status()};
  const int port = (*store)->port();
  auto run = [&, port](int rank) {
    ReplicaGroup::Options o = Member(port, rank, timeout);
    if (nccl) {
      o.nccl = true;
      o.device = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(rank));
      o.interrupted = interrupted;
    }
    ReplicaGroup group(o);
    return body(group);
  };
  auto other = std::async(std::launch::async, run, 1);
  Status st0 = run(0);
  return {st0, other.get()};
}

TEST(ReplicaGroup, BroadcastGivesEveryMemberReplicaZerosTensorsAndBytes) {
  if (!ReplicaGroupsAvailable()) GTEST_SKIP() << "built without c10d's Gloo group";
  std::vector<at::Tensor> got[2];
  std::string bytes[2] = {std::string("checkpoint\0payload", 18), "stale"};
  auto [st0, st1] = BothMembers(10s, [&](ReplicaGroup& g) {
    std::vector<at::Tensor> t{at::full({3}, g.rank() + 1.0), at::full({2}, 7 * (g.rank() + 1), at::kLong)};
    Status st = g.Broadcast(t);
    got[g.rank()] = t;
    if (st.ok()) st = g.BroadcastBytes(&bytes[g.rank()]);
    return st;
  });
  ASSERT_TRUE(st0.ok()) << st0;
  ASSERT_TRUE(st1.ok()) << st1;
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(at::equal(got[r][0], at::full({3}, 1.0))) << "replica " << r;
    EXPECT_TRUE(at::equal(got[r][1], at::full({2}, 7, at::kLong))) << "replica " << r;
    EXPECT_EQ(bytes[r], std::string("checkpoint\0payload", 18)) << "replica " << r;
  }
}

// Gloo has no bfloat16 (1.13 throws "Invalid scalar type"): a bf16 stage's
// gradients are summed in float and rounded back, its parameters (ZeRO-1's
// all-gather) broadcast bit for bit.
TEST(ReplicaGroup, BFloat16GradientsAreSummedAndBroadcastThroughGloo) {
  if (!ReplicaGroupsAvailable()) GTEST_SKIP() << "built without c10d's Gloo group";
  std::vector<at::Tensor> sums[2], params[2];
  auto [st0, st1] = BothMembers(10s, [&](ReplicaGroup& g) {
    // 1 + 2^-7 and 2^-8: each exact in bfloat16, their sum is not (rounded once, to 1 + 2^-6).
    const double mine = g.rank() == 0 ? 1.0 + 1.0 / 128 : 1.0 / 256;
    std::vector<at::Tensor> grads{at::full({5}, mine, at::kBFloat16), at::full({3}, g.rank() + 1.0)};
    Status st = g.AllReduce(grads);
    sums[g.rank()] = grads;
    std::vector<at::Tensor> p{at::full({4}, 0.1 * (g.rank() + 1), at::kBFloat16)};
    if (st.ok()) st = g.Broadcast(p);
    params[g.rank()] = p;
    return st;
  });
  ASSERT_TRUE(st0.ok()) << st0;
  ASSERT_TRUE(st1.ok()) << st1;
  const at::Tensor want = at::full({5}, 1.0 + 1.0 / 64, at::kBFloat16);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(sums[r][0].scalar_type(), at::kBFloat16);
    EXPECT_TRUE(at::equal(sums[r][0], want)) << "replica " << r << ": " << sums[r][0];
    EXPECT_TRUE(at::equal(sums[r][1], at::full({3}, 3.0))) << "replica " << r;
    EXPECT_TRUE(at::equal(params[r][0], at::full({4}, 0.1, at::kBFloat16))) << "replica " << r;
  }
}

// Replica 1 joined and took part in the first all-reduce, then stays alive
// but never comes to the second (a stage stuck elsewhere): replica 0 waits
// stage_timeout for it, not for ever. One that died instead (its process,
// and so its connections, gone) fails replica 0 at once with UNAVAILABLE.
TEST(ReplicaGroup, AMemberThatStopsTakingPartIsADeadlineForTheOtherNotAHang) {
  if (!ReplicaGroupsAvailable()) GTEST_SKIP() << "built without c10d's Gloo group";
  Status second;
  std::promise<void> zero_done;
  std::shared_future<void> released = zero_done.get_future().share();
  auto [st0, st1] = BothMembers(2000ms, [&](ReplicaGroup& g) {
    std::vector<at::Tensor> grads{at::ones({4})};
    Status st = g.AllReduce(grads);
    if (g.rank() == 1) {
      released.wait();  // alive, its group open, until replica 0 gave up
      return st;
    }
    second = st.ok() ? g.AllReduce(grads) : st;
    zero_done.set_value();
    return st;
  });
  ASSERT_TRUE(st0.ok()) << st0;
  ASSERT_TRUE(st1.ok()) << st1;
  ASSERT_FALSE(second.ok());
  EXPECT_TRUE(absl::IsDeadlineExceeded(second)) << second;
  EXPECT_THAT(std::string(second.message()), HasSubstr("stage 0 of replica 0 (all-reduce over 2 replicas)")) << second;
  EXPECT_THAT(std::string(second.message()), HasSubstr("did not take part within stage_timeout")) << second;
}

TEST(ReplicaGroup, AMemberThatDiesMidJobFailsTheOtherNotAHang) {
  if (!ReplicaGroupsAvailable()) GTEST_SKIP() << "built without c10d's Gloo group";
  Status second;
  auto [st0, st1] = BothMembers(10s, [&](ReplicaGroup& g) {
    std::vector<at::Tensor> grads{at::ones({4})};
    Status st = g.AllReduce(grads);
    if (!st.ok() || g.rank() == 1) return st;  // replica 1's group closes as it returns
    second = g.AllReduce(grads);
    return Status();
  });
  ASSERT_TRUE(st0.ok()) << st0;
  ASSERT_TRUE(st1.ok()) << st1;
  ASSERT_FALSE(second.ok());
  EXPECT_TRUE(absl::IsUnavailable(second) || absl::IsDeadlineExceeded(second)) << second;
  EXPECT_THAT(std::string(second.message()), HasSubstr("stage 0 of replica 0 (all-reduce over 2 replicas)")) << second;
}

// A replica's stage: two linear layers (and one parameter the pass never
// uses), trained on two micro-batches of its own rows.
struct TinyStage {
  explicit TinyStage(at::Device device = at::kCPU) : device(device) {}
  at::Device device;
  at::Tensor w1 = at::arange(12, at::kFloat).reshape({4, 3}).div(10).to(device).requires_grad_();
  at::Tensor b1 = at::zeros({4}).to(device).requires_grad_();
  at::Tensor w2 = at::arange(8, at::kFloat).reshape({2, 4}).div(-10).to(device).requires_grad_();
  at::Tensor unused = at::ones({5}).to(device).requires_grad_();
  std::vector<at::Tensor> params() const { return {unused, w1, b1, w2}; }
  void Backward(const at::Tensor& rows) {
    const at::Tensor x = rows.to(device);
    at::Tensor h = at::relu(at::matmul(x, w1.t()) + b1);
    at::matmul(h, w2.t()).pow(2).sum().backward();
  }
};

at::Tensor Rows(int replica, int micro_batch) {
  return at::arange(6, at::kFloat).reshape({2, 3}).add(replica * 10 + micro_batch).div(7);
}

// What the replicas' sums must be: both replicas' two micro-batches in one
// process, on the CPU.
TinyStage BothReplicasInOneProcess() {
  TinyStage whole;
  for (int r = 0; r < 2; ++r)
    for (int mb = 0; mb < 2; ++mb) whole.Backward(Rows(r, mb));
  return whole;
}

// Two replicas of TinyStage (on cuda:RANK with `nccl`) through a reducer.
void ExpectBucketsStartDuringTheLastBackwardAndSumEveryReplicasGradients(bool nccl) {
  const TinyStage whole = BothReplicasInOneProcess();
  std::vector<at::Tensor> got[2];
  int buckets[2] = {0, 0};
  bool started_in_backward[2] = {false, false};
  auto [st0, st1] = BothMembers(10s, [&](ReplicaGroup& g) {
    TinyStage stage(nccl ? at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(g.rank())) : at::Device(at::kCPU));
    // 16 floats a bucket at most, in reverse: w2 and b1 (8 + 4), w1 (12), `unused` (5).
    GradientReducer reducer(&g, stage.params(), 16 * 4);
    buckets[g.rank()] = reducer.num_buckets();
    reducer.Reset();
    stage.Backward(Rows(g.rank(), 0));  // not armed: accumulates as usual
    Status st = reducer.Arm(0, 4);
    if (!st.ok()) return st;
    stage.Backward(Rows(g.rank(), 1));
    const int64_t before_finish =
        std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
    st = reducer.Finish();
    // The buckets of (w2, b1) and of w1 were full in the backward pass and
    // started there; `unused` never got a gradient and started in Finish.
    started_in_backward[g.rank()] =
        reducer.spans().size() == 3 && reducer.spans()[0].start_us <= before_finish &&
        reducer.spans()[1].start_us <= before_finish;
    for (const at::Tensor& p : stage.params()) got[g.rank()].push_back(p.grad().cpu());
    return st;
  }, nccl);
  ASSERT_TRUE(st0.ok()) << st0;
  ASSERT_TRUE(st1.ok()) << st1;
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(buckets[r], 3);
    EXPECT_TRUE(started_in_backward[r]) << "replica " << r;
    for (std::size_t i = 1; i < 4; ++i)
      EXPECT_TRUE(at::allclose(got[r][i], whole.params()[i].grad(), 1e-5, 1e-6)) << "replica " << r << " parameter " << i;
    ASSERT_TRUE(got[r][0].defined()) << "a parameter without gradients gets the (zero) sum";
    EXPECT_TRUE(at::equal(got[r][0], at::zeros({5})));
  }
  EXPECT_TRUE(at::equal(got[0][1], got[1][1])) << "the replicas' sums are bit for bit the same";
}

TEST(GradientReducer, BucketsStartDuringTheLastBackwardAndSumEveryReplicasGradients) {
  if (!ReplicaGroupsAvailable()) GTEST_SKIP() << "built without c10d's Gloo group";
  ExpectBucketsStartDuringTheLastBackwardAndSumEveryReplicasGradients(/*nccl=*/false);
}

// Passes replayed as CUDA graphs run no hooks: a reducer without hooks
// (armed or not) starts every bucket in Finish, in order, and sums them all.
TEST(GradientReducer, WithoutHooksFinishStartsAndSumsEveryBucket) {
  if (!ReplicaGroupsAvailable()) GTEST_SKIP() << "built without c10d's Gloo group";
  const TinyStage whole = BothReplicasInOneProcess();
  std::vector<at::Tensor> got[2];
  std::size_t spans[2] = {0, 0};
  auto [st0, st1] = BothMembers(10s, [&](ReplicaGroup& g) {
    TinyStage stage;
    GradientReducer reducer(&g, stage.params(), 16 * 4, /*hooks=*/false);
    reducer.ZeroGrads();
    reducer.Reset();
    stage.Backward(Rows(g.rank(), 0));
    // Replica 1 arms for its last pass, replica 0 does not: the same either way.
    Status st = g.rank() == 1 ? reducer.Arm(0, 4) : Status();
    if (!st.ok()) return st;
    stage.Backward(Rows(g.rank(), 1));
    const int64_t before_finish =
        std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
    st = reducer.Finish();
    for (const GradientReducer::Span& s : reducer.spans())
      if (s.start_us >= before_finish) ++spans[g.rank()];  // none started in backward
    for (const at::Tensor& p : stage.params()) got[g.rank()].push_back(p.grad().clone());
    return st;
  });
  ASSERT_TRUE(st0.ok()) << st0;
  ASSERT_TRUE(st1.ok()) << st1;
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(spans[r], 3u) << "replica " << r;
    for (std::size_t i = 1; i < 4; ++i)
      EXPECT_TRUE(at::allclose(got[r][i], whole.params()[i].grad(), 1e-5, 1e-6)) << "replica " << r << " parameter " << i;
    EXPECT_TRUE(at::equal(got[r][0], at::zeros({5})));
  }
}

// ZeRO-1's buckets (slice): each replica gets the sums of its slice of every
// bucket as the gradients of its parts (the parameters' elements there: w2
// cut between the slices of its bucket, `unused` between the slices of one
// padded to 6), updates them, and the all-gather gives every replica every
// parameter whole: here one step of plain gradient descent, lr 1, which must
// equal the whole run's.
void ExpectSlicedReplicasUpdateTheirPartsAndGatherWholeParameters(bool nccl) {
  const TinyStage whole = BothReplicasInOneProcess();
  std::vector<at::Tensor> got[2];
  int64_t part_elements[2] = {0, 0};
  auto [st0, st1] = BothMembers(10s, [&](ReplicaGroup& g) {
    TinyStage stage(nccl ? at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(g.rank())) : at::Device(at::kCPU));
    GradientReducer reducer(&g, stage.params(), 16 * 4, /*hooks=*/true, /*slice=*/true);
    std::vector<GradientReducer::Part> parts;
    {
      at::NoGradGuard no_grad;
      parts = reducer.SliceParameters();
    }
    for (const auto& part : parts) part_elements[g.rank()] += part.tensor.numel();
    reducer.Reset();
    stage.Backward(Rows(g.rank(), 0));
    Status st = reducer.Arm(0, 4);
    if (!st.ok()) return st;
    stage.Backward(Rows(g.rank(), 1));
    st = reducer.Finish();
    if (!st.ok()) return st;
    {
      at::NoGradGuard no_grad;
      for (const auto& part : parts) part.tensor.sub_(part.tensor.grad());
      st = reducer.GatherParameters();
    }
    for (const at::Tensor& p : stage.params()) got[g.rank()].push_back(p.detach().cpu());
    return st;
  }, nccl);
  ASSERT_TRUE(st0.ok()) << st0;
  ASSERT_TRUE(st1.ok()) << st1;
  EXPECT_EQ(part_elements[0] + part_elements[1], 5 + 12 + 4 + 8) << "the parts cover every element once";
  EXPECT_GT(part_elements[0], 0);
  EXPECT_GT(part_elements[1], 0);
  for (int r = 0; r < 2; ++r) {
    for (std::size_t i = 0; i < 4; ++i) {
      const at::Tensor p = whole.params()[i];
      const at::Tensor want = p.grad().defined() ? (p - p.grad()).detach() : p.detach();
      EXPECT_TRUE(at::allclose(got[r][i], want, 1e-5, 1e-6)) << "replica " << r << " parameter " << i << ": " << got[r][i];
    }
  }
  for (std::size_t i = 0; i < 4; ++i) EXPECT_TRUE(at::equal(got[0][i], got[1][i])) << "parameter " << i;
}

TEST(GradientReducer, SlicedEachReplicaUpdatesItsPartsAndEveryOneGetsTheWholeParameters) {
  if (!ReplicaGroupsAvailable()) GTEST_SKIP() << "built without c10d's Gloo group";
  ExpectSlicedReplicasUpdateTheirPartsAndGatherWholeParameters(/*nccl=*/false);
}

// ZeRO-1's state in a checkpoint: a field of each replica's parts (here the
// parts' own values, plus 1) gathered whole is every parameter's value plus
// 1 on every replica, in the parameter's shape; PartsOf cuts it back into
// the replica's parts.
TEST(GradientReducer, SlicedStateGathersWholeByParameterAndCutsBackIntoParts) {
  if (!ReplicaGroupsAvailable()) GTEST_SKIP() << "built without c10d's Gloo group";
  std::vector<at::Tensor> want, got[2];
  bool round_trip[2] = {false, false};
  auto [st0, st1] = BothMembers(10s, [&](ReplicaGroup& g) {
    TinyStage stage(at::Device(at::kCPU));
    GradientReducer reducer(&g, stage.params(), 16 * 4, /*hooks=*/true, /*slice=*/true);
    std::vector<at::Tensor> fields;
    {
      at::NoGradGuard no_grad;
      for (const auto& part : reducer.SliceParameters()) fields.push_back(part.tensor.detach() + 1);
    }
    if (g.rank() == 0)
      for (const at::Tensor& p : stage.params()) want.push_back(p.detach() + 1);
    auto whole = reducer.GatherWhole(fields);
    if (!whole.ok()) return whole.status();
    got[g.rank()] = *whole;
    auto parts = reducer.PartsOf(*whole);
    if (!parts.ok()) return parts.status();
    round_trip[g.rank()] = parts->size() == fields.size();
    for (std::size_t j = 0; j < fields.size() && j < parts->size(); ++j)
      round_trip[g.rank()] = round_trip[g.rank()] && at::equal((*parts)[j], fields[j]);
    return Status();
  });
  ASSERT_TRUE(st0.ok()) << st0;
  ASSERT_TRUE(st1.ok()) << st1;
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(got[r].size(), want.size());
    for (std::size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(got[r][i].sizes(), want[i].sizes()) << "replica " << r << " parameter " << i;
      EXPECT_TRUE(at::equal(got[r][i], want[i])) << "replica " << r << " parameter " << i;
    }
    EXPECT_TRUE(round_trip[r]) << "replica " << r;
  }
}

bool TwoGpusWithNccl() { return ReplicaGroupsAvailable() && NcclBuilt() && CudaDeviceCount() >= 2; }

// The same over NCCL on two GPUs: the buckets' sums on the devices, each
// started by the backward pass on the group's stream.
TEST(GradientReducer, OverNcclOnTwoGpusTheBucketsSumEveryReplicasGradients) {
  if (!TwoGpusWithNccl()) GTEST_SKIP() << "needs two GPUs, NCCL and c10d's Gloo group (the id's store)";
  ExpectBucketsStartDuringTheLastBackwardAndSumEveryReplicasGradients(/*nccl=*/true);
}

// ZeRO-1's reduce-scatter and all-gather over NCCL, in place on the devices.
TEST(GradientReducer, OverNcclOnTwoGpusSlicedReplicasUpdateTheirPartsAndGatherWholeParameters) {
  if (!TwoGpusWithNccl()) GTEST_SKIP() << "needs two GPUs, NCCL and c10d's Gloo group (the id's store)";
  ExpectSlicedReplicasUpdateTheirPartsAndGatherWholeParameters(/*nccl=*/true);
}

// NCCL collectives on two GPUs: sums (fp32 and bf16) and a broadcast on the
// devices; bytes still travel through Gloo.
TEST(ReplicaGroup, NcclSumsAndBroadcastsOnTheDevicesOfTwoGpus) {
  if (!TwoGpusWithNccl()) GTEST_SKIP() << "needs two GPUs, NCCL and c10d's Gloo group (the id's store)";
  std::vector<at::Tensor> got[2];
  std::string bytes[2] = {"replica 0's checkpoint", ""};
  auto [st0, st1] = BothMembers(10s, [&](ReplicaGroup& g) {
    const auto on = at::TensorOptions().device(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(g.rank())));
    std::vector<at::Tensor> grads{at::full({1000}, g.rank() + 1.0, on), at::full({7}, g.rank() + 1.0, on.dtype(at::kBFloat16))};
    Status st = g.AllReduce(grads);
    std::vector<at::Tensor> buffers{at::full({3}, 5.0 * (g.rank() + 1), on)};
    if (st.ok()) st = g.Broadcast(buffers);
    if (st.ok()) st = g.BroadcastBytes(&bytes[g.rank()]);
    got[g.rank()] = {grads[0].cpu(), grads[1].cpu().to(at::kFloat), buffers[0].cpu()};
    return st;
  }, /*nccl=*/true);
  ASSERT_TRUE(st0.ok()) << st0;
  ASSERT_TRUE(st1.ok()) << st1;
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(at::equal(got[r][0], at::full({1000}, 3.0))) << "replica " << r;
    EXPECT_TRUE(at::equal(got[r][1], at::full({7}, 3.0))) << "replica " << r;
    EXPECT_TRUE(at::equal(got[r][2], at::full({3}, 5.0))) << "replica " << r;
    EXPECT_EQ(bytes[r], "replica 0's checkpoint");
  }
}

// A step aborted (the coordinator's Abort, which fails the stage's inbox)
// ends replica 0's wait for an all-reduce that replica 1 never joins, with
// the abort's status, well before the group's timeout (60 s: a wait that
// ignored the abort would end DEADLINE_EXCEEDED).
TEST(ReplicaGroup, AnAbortedStepEndsTheWaitForAnNcclSumThatAReplicaNeverJoins) {
  if (!TwoGpusWithNccl()) GTEST_SKIP() << "needs two GPUs, NCCL and c10d's Gloo group (the id's store)";
  std::atomic<bool> aborted{false};
  Status second;
  auto [st0, st1] = BothMembers(60s, [&](ReplicaGroup& g) {
    const auto on = at::TensorOptions().device(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(g.rank())));
    std::vector<at::Tensor> grads{at::ones({16}, on)};
    Status st = g.AllReduce(grads);
    if (!st.ok() || g.rank() == 1) return st;  // replica 1 takes part once
    aborted = true;  // as the coordinator's Abort would, while replica 0 waits
    second = g.AllReduce(grads);
    return Status();
  }, /*nccl=*/true, [&]() -> Status {
    return aborted ? absl::AbortedError("stage 0: step aborted: stage 1 failed") : Status();
  });
  ASSERT_TRUE(st0.ok()) << st0;
  ASSERT_TRUE(st1.ok()) << st1;
  EXPECT_TRUE(absl::IsAborted(second)) << second;
}

// On a CUDA device, Gloo sums CUDA tensors (through host copies): what two
// stage servers on one GPU use for replicas where NCCL would need a GPU each.
TEST(ReplicaGroup, CudaGradientsAreSummedToo) {
  if (!ReplicaGroupsAvailable()) GTEST_SKIP() << "built without c10d's Gloo group";
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device here";
  at::Tensor got[2];
  auto [st0, st1] = BothMembers(10s, [&](ReplicaGroup& g) {
    std::vector<at::Tensor> grads{at::full({1000}, g.rank() + 1.0, at::TensorOptions().device(at::kCUDA))};
    Status st = g.AllReduce(grads);
    got[g.rank()] = grads[0].cpu();
    return st;
  });
  ASSERT_TRUE(st0.ok()) << st0;
  ASSERT_TRUE(st1.ok()) << st1;
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(at::equal(got[r], at::full({1000}, 3.0))) << "replica " << r;
}

}  // namespace
}  // namespace conveyor
