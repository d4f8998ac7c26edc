// Which links can use NCCL (WhyNotNccl) and what the copies of each stage
// sum their gradients with (PlanCollectives), on stage infos as servers
// report them.
#include "coordinator/job_planner.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace conveyor {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;

v1::StageInfo Info(int index, const std::string& device, bool nccl, const std::string& uuid = "") {
  v1::StageInfo info;
  info.set_stage_index(index);
  info.set_device(device);
  info.set_nccl(nccl);
  info.set_gpu_uuid(uuid);
  return info;
}

TEST(WhyNotNccl, StagesOnDifferentGpusCanUseIt) {
  EXPECT_THAT(WhyNotNccl(Info(0, "cuda:0", true), "10.0.0.1:7000", Info(1, "cuda:1", true), "10.0.0.1:7001"),
              IsEmpty());
}

// Servers that each see one GPU (a container, CUDA_VISIBLE_DEVICES, a Slurm
// task) all say cuda:0: their UUIDs tell whether they share a GPU.
TEST(WhyNotNccl, ServersThatEachSeeOneGpuAreToldApartByTheirUuids) {
  EXPECT_THAT(WhyNotNccl(Info(0, "cuda:0", true, "GPU-aaaa"), "10.0.0.1:7000", Info(1, "cuda:0", true, "GPU-bbbb"),
                         "10.0.0.1:7001"),
              IsEmpty());
  EXPECT_EQ(WhyNotNccl(Info(0, "cuda:0", true, "GPU-aaaa"), "10.0.0.1:7000", Info(1, "cuda:1", true, "GPU-aaaa"),
                       "10.0.0.1:7001"),
            "both stages are on the GPU GPU-aaaa");
}

TEST(WhyNotNccl, WithoutUuidsTheSameDeviceOnTheSameHostIsOneGpu) {
  EXPECT_EQ(WhyNotNccl(Info(0, "cuda", true), "10.0.0.1:7000", Info(1, "cuda:0", true), "10.0.0.1:7001"),
            "both stages are on cuda:0 of 10.0.0.1");
  EXPECT_THAT(WhyNotNccl(Info(0, "cuda:0", true), "node1:7000", Info(1, "cuda:0", true), "node2:7000"), IsEmpty());
}

TEST(WhyNotNccl, ACpuStageOrAServerWithoutNcclNamesTheStage) {
  EXPECT_EQ(WhyNotNccl(Info(0, "cuda:0", true), "h:1", Info(1, "cpu", false), "h:2"),
            "stage 1 is on cpu, not a CUDA device");
  EXPECT_THAT(WhyNotNccl(Info(3, "cuda:0", false), "h:1", Info(4, "cuda:1", true), "h:2"),
              HasSubstr("stage 3 is on cuda:0 in a server built without NCCL"));
}

// Two replicas of two stages: replica k's stage s at k * 2 + s.
std::vector<std::string> FourAddresses() { return {"h:1", "h:2", "h:3", "h:4"}; }

v1::JobSpec Collectives(v1::CollectiveKind kind) {
  v1::JobSpec spec;
  spec.set_collectives(kind);
  return spec;
}

TEST(PlanCollectives, AutoTakesNcclWhereEveryCopyOfAStageHasAGpuOfItsOwn) {
  // Stage 0's copies on cuda:0 and cuda:2, stage 1's both on cuda:1.
  const std::vector<v1::StageInfo> infos = {Info(0, "cuda:0", true), Info(1, "cuda:1", true), Info(0, "cuda:2", true),
                                            Info(1, "cuda:1", true)};
  for (v1::CollectiveKind want : {v1::COLLECTIVES_UNSPECIFIED, v1::COLLECTIVES_AUTO}) {
    auto kinds = PlanCollectives(Collectives(want), infos, FourAddresses(), 2);
    ASSERT_TRUE(kinds.ok()) << kinds.status();
    EXPECT_THAT(*kinds, ::testing::ElementsAre(v1::COLLECTIVES_NCCL, v1::COLLECTIVES_GLOO));
  }
}

TEST(PlanCollectives, NcclWhereItCannotWorkNamesTheStageAndTheReplicas) {
  const std::vector<v1::StageInfo> infos = {Info(0, "cuda:0", true), Info(1, "cpu", false), Info(0, "cuda:1", true),
                                            Info(1, "cpu", false)};
  auto kinds = PlanCollectives(Collectives(v1::COLLECTIVES_NCCL), infos, FourAddresses(), 2);
  ASSERT_EQ(kinds.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(kinds.status().message()),
              HasSubstr("the copies of stage 1 cannot sum their gradients with NCCL (replicas 0 and 1: stage 1 is on "
                        "cpu, not a CUDA device)"));
  // Stage 0 alone would do: two GPUs told apart by their UUIDs.
  const std::vector<v1::StageInfo> one = {Info(0, "cuda:0", true, "GPU-a"), Info(0, "cuda:0", true, "GPU-b")};
  auto ok = PlanCollectives(Collectives(v1::COLLECTIVES_NCCL), one, {"h:1", "h:2"}, 1);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_THAT(*ok, ::testing::ElementsAre(v1::COLLECTIVES_NCCL));
}

TEST(PlanCollectives, GlooIsTakenWhenAskedForEvenOnGpus) {
  const std::vector<v1::StageInfo> infos = {Info(0, "cuda:0", true), Info(0, "cuda:1", true)};
  auto kinds = PlanCollectives(Collectives(v1::COLLECTIVES_GLOO), infos, {"h:1", "h:2"}, 1);
  ASSERT_TRUE(kinds.ok()) << kinds.status();
  EXPECT_THAT(*kinds, ::testing::ElementsAre(v1::COLLECTIVES_GLOO));
}

}  // namespace
}  // namespace conveyor
