// `conveyor local` on GPUs (plan/placement.h): a job whose stages outnumber
// the host's GPUs is folded into one stage per GPU, consecutive stages
// together, and the folded job is a valid job; where it cannot be, the job
// keeps its stages and says why.
#include "plan/placement.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "plan/job_overrides.h"
#include "plan/job_spec.h"

namespace conveyor {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

const std::string kJob =
    "model: convnet\ndata: {name: synthetic, train_samples: 64}\nbatch_size: 16\nmicro_batches: 4\nsteps: 2\n"
    "optimizer: {name: sgd, lr: 0.1}\n";

v1::JobSpec Job(const std::string& extra) {
  auto spec = ParseJobYaml(kJob + extra);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : v1::JobSpec();
}

// The folded job, as `conveyor local` submits it.
v1::JobSpec Folded(const std::string& extra, const GpuFold& fold) {
  auto yaml = ApplyJobOverrides(kJob + extra, fold.sets);
  EXPECT_TRUE(yaml.ok()) << yaml.status();
  auto spec = ParseJobYaml(yaml.ok() ? *yaml : "");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : v1::JobSpec();
}

TEST(FoldOntoGpus, FourStagesOnTwoGpusRunAsTwo) {
  const std::string extra = "partition: {stages: 4}\n";
  const GpuFold fold = FoldOntoGpus(Job(extra), 2);
  EXPECT_EQ(fold.stages, 4);
  EXPECT_EQ(fold.folded, 2);
  EXPECT_THAT(fold.why_not, IsEmpty());
  EXPECT_EQ(Folded(extra, fold).partition().stages(), 2);
}

TEST(FoldOntoGpus, AJobThatFitsTheGpusOrRunsOnTheCpuIsLeftAsItIs) {
  for (int gpus : {0, 4, 8}) {
    const GpuFold fold = FoldOntoGpus(Job("partition: {stages: 4}\n"), gpus);
    EXPECT_EQ(fold.folded, 4) << gpus;
    EXPECT_THAT(fold.sets, IsEmpty()) << gpus;
    EXPECT_THAT(fold.why_not, IsEmpty()) << gpus;
  }
}

TEST(FoldOntoGpus, BoundariesKeepEveryKthCutAndRecomputedStagesFoldWithThem) {
  const std::string extra = "partition: {boundaries: [3, 6, 9]}\nrecompute: [1, 3]\n";
  const GpuFold fold = FoldOntoGpus(Job(extra), 2);
  EXPECT_EQ(fold.folded, 2);
  const v1::JobSpec folded = Folded(extra, fold);
  EXPECT_EQ(folded.partition().stages(), 2);
  EXPECT_THAT(folded.partition().boundaries(), ElementsAre(6));
  EXPECT_THAT(folded.recompute_stages(), ElementsAre(0, 1));
}

TEST(FoldOntoGpus, ReplicasKeepTheirCountAndFoldTheirStages) {
  const std::string extra = "partition: {stages: 4}\nreplicas: 2\n";
  const GpuFold fold = FoldOntoGpus(Job(extra), 4);
  EXPECT_EQ(fold.folded, 2);
  const v1::JobSpec folded = Folded(extra, fold);
  EXPECT_EQ(folded.partition().stages(), 2);
  EXPECT_EQ(Replicas(folded), 2);
}

TEST(FoldOntoGpus, StagesThatDoNotDivideFoldOnlyWhereThePlannerCuts) {
  const GpuFold free_cut = FoldOntoGpus(Job("partition: {stages: 3}\n"), 2);
  EXPECT_EQ(free_cut.folded, 2);
  const GpuFold pinned = FoldOntoGpus(Job("partition: {boundaries: [4, 8]}\n"), 2);
  EXPECT_EQ(pinned.folded, 3);
  EXPECT_THAT(pinned.sets, IsEmpty());
  EXPECT_THAT(pinned.why_not, HasSubstr("do not fold evenly onto 2"));
}

TEST(FoldOntoGpus, WhereItCannotFoldItSaysWhy) {
  const GpuFold interleaved = FoldOntoGpus(
      Job("partition: {stages: 4}\nschedule: interleaved\nvirtual_stages: 2\n"), 2);
  EXPECT_EQ(interleaved.folded, 4);
  EXPECT_THAT(interleaved.why_not, HasSubstr("interleaved"));
  const GpuFold replicas = FoldOntoGpus(Job("partition: {stages: 2}\nreplicas: 4\n"), 2);
  EXPECT_EQ(replicas.folded, 2);
  EXPECT_THAT(replicas.why_not, HasSubstr("more replicas (4) than GPUs"));
}

// A job that lost servers keeps whole stages of its cut on each server left,
// merging the adjacent pair with the fewest layers first.
TEST(MergeStages, MergesTheSmallestAdjacentStagesUntilTheServersLeft) {
  // Stages [0,3) [3,5) [5,9) [9,12): 3, 2, 4, 3 layers.
  EXPECT_EQ(MergeStages({3, 5, 9}, 12, 4), (std::vector<int>{3, 5, 9}));
  EXPECT_EQ(MergeStages({3, 5, 9}, 12, 3), (std::vector<int>{5, 9}));  // 3 + 2 is the smallest pair
  EXPECT_EQ(MergeStages({3, 5, 9}, 12, 2), (std::vector<int>{5}));
  EXPECT_EQ(MergeStages({3, 5, 9}, 12, 1), (std::vector<int>{}));
  EXPECT_EQ(MergeStages({}, 12, 1), (std::vector<int>{}));
}

// An MLP of 8 layers (Flatten, three Linear and ReLU pairs, Linear).
v1::JobSpec Mlp(const std::string& extra) {
  auto spec = ParseJobYaml(
      "model: {name: mlp, input_dim: 32, hidden: [64, 64, 32]}\ndata: {name: synthetic, train_samples: 64}\n"
      "batch_size: 16\nmicro_batches: 4\nsteps: 2\noptimizer: {name: sgd, lr: 0.1}\n" + extra);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : v1::JobSpec();
}

std::vector<int> Boundaries(const v1::JobSpec& spec) {
  return std::vector<int>(spec.partition().boundaries().begin(), spec.partition().boundaries().end());
}

// One chunk a server: the cut merged as MergeStages merges it, the
// recomputed stage's layers recomputed where they go.
TEST(FoldOntoServers, FoldsOneChunkAServerAndMovesRecomputeWithItsLayers) {
  auto fold = FoldOntoServers(Mlp("partition: {stages: 4}\nschedule: 1f1b\nrecompute: [3]\n"), 3);
  ASSERT_TRUE(fold.ok()) << fold.status();
  EXPECT_EQ(fold->spec.partition().stages(), 3);
  EXPECT_EQ(Boundaries(fold->spec), (std::vector<int>{4, 6}));  // [0,2) [2,4) merged first
  EXPECT_EQ(fold->cut, "4, 6");
  EXPECT_THAT(fold->spec.recompute_stages(), ElementsAre(2));
  EXPECT_THAT(fold->changed, IsEmpty());
}

// zbv keeps two chunks a server in its V: 8 chunks over 4 servers become 6
// over 3; a recomputed server's two chunks land on the servers that hold them
// now.
TEST(FoldOntoServers, KeepsZbvsTwoChunksAServer) {
  auto fold = FoldOntoServers(Mlp("partition: {stages: 4}\nschedule: zbv\nrecompute: [0]\n"), 3);
  ASSERT_TRUE(fold.ok()) << fold.status();
  EXPECT_EQ(fold->spec.schedule(), v1::SCHEDULE_ZBV);
  EXPECT_EQ(fold->spec.virtual_stages(), 2);
  // One layer a chunk: chunks 0 and 1 merged, then the new pair of fewest
  // layers, chunks 2 and 3.
  EXPECT_EQ(Boundaries(fold->spec), (std::vector<int>{2, 4, 5, 6, 7}));
  // Old server 0 held chunks 0 and 7 (layers 0 and 7): new chunks 0 and 5,
  // both on new server 0 of the V.
  EXPECT_THAT(fold->spec.recompute_stages(), ElementsAre(0));
  auto one = FoldOntoServers(fold->spec, 1);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->spec.partition().boundaries_size(), 1);
}

// Interleaved keeps its chunks where the micro-batches still divide over the
// servers left, and goes on as 1F1B, saying so, where they do not.
TEST(FoldOntoServers, InterleavedGoesOnAs1F1BWhereTheMicroBatchesDoNotDivide) {
  const v1::JobSpec job = Mlp("partition: {stages: 4}\nschedule: interleaved\nvirtual_stages: 2\n");
  auto two = FoldOntoServers(job, 2);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->spec.schedule(), v1::SCHEDULE_INTERLEAVED);
  EXPECT_EQ(two->spec.partition().boundaries_size(), 3);
  EXPECT_THAT(two->changed, IsEmpty());
  auto three = FoldOntoServers(job, 3);
  ASSERT_TRUE(three.ok()) << three.status();
  EXPECT_EQ(three->spec.schedule(), v1::SCHEDULE_1F1B);
  EXPECT_EQ(three->spec.virtual_stages(), 1);
  EXPECT_EQ(three->spec.partition().boundaries_size(), 2);
  EXPECT_THAT(three->changed, HasSubstr("goes on as 1f1b"));
}

// What may differ between a checkpoint and the job that loads it resharded:
// the layout, not the training.
TEST(TrainingDigest, IgnoresTheLayoutAndSeesTheTraining) {
  const v1::JobSpec a = Job("partition: {stages: 4}\nschedule: 1f1b\n");
  const v1::JobSpec folded =
      Job("partition: {stages: 2}\nschedule: gpipe\non_lost_server: fail\nreplicas: 2\nzero: 1\n");
  EXPECT_EQ(TrainingDigest(a), TrainingDigest(folded));
  EXPECT_NE(TrainingDigest(a), TrainingDigest(Job("partition: {stages: 4}\nschedule: 1f1b\nseed: 99\n")));
  EXPECT_NE(TrainingDigest(a), TrainingDigest(Job("partition: {stages: 4}\nschedule: 1f1b\naccumulate_steps: 2\n")));
}

}  // namespace
}  // namespace conveyor
