// The replicas' gradient all-reduce (stage_server/replica_group.h): members
// sum in place, and a member that never comes is an error, not a hang.
#include "stage_server/replica_group.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

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
  EXPECT_THAT(std::string(st.message()), HasSubstr("stage 0 of replica 0 (all-reduce over 2 replicas)")) << st;
  // It reached the store (under a second, 1.13's store client would not) and waited for replica 1.
  EXPECT_THAT(std::string(st.message()), ::testing::Not(HasSubstr("trying to connect"))) << st;
}

}  // namespace
}  // namespace conveyor
