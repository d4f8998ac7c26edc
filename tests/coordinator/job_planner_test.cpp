// Which links can use NCCL: WhyNotNccl on stage infos as servers report them.
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

}  // namespace
}  // namespace conveyor
