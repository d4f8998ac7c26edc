#include "model/dataset.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "plan/job_spec.h"
#include "tests/support/test_util.h"

namespace conveyor {
namespace {

using ::testing::HasSubstr;

v1::JobSpec Spec(const std::string& yaml) {
  auto spec = ParseJobYaml(yaml);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

TEST(Dataset, SyntheticIsDeterministicPerSeedAndStep) {
  v1::JobSpec spec = Spec("model: toy\nbatch_size: 8\ndata: {name: synthetic, train_samples: 64, test_samples: 20}\n");
  auto a = Dataset::Open(spec, true, true);
  auto inputs_only = Dataset::Open(spec, true, false);
  auto labels_only = Dataset::Open(spec, false, true);
  ASSERT_TRUE(a.ok() && inputs_only.ok() && labels_only.ok());
  EXPECT_EQ((*a)->StepsPerEpoch(), 8);
  EXPECT_EQ((*a)->EvalBatches(), 1);
  // The first stage (inputs) and the last (labels) see the same samples.
  EXPECT_TRUE(at::equal((*a)->Inputs(v1::PHASE_TRAIN, 3), (*inputs_only)->Inputs(v1::PHASE_TRAIN, 3)));
  EXPECT_TRUE(at::equal((*a)->Labels(v1::PHASE_TRAIN, 3), (*labels_only)->Labels(v1::PHASE_TRAIN, 3)));
  EXPECT_FALSE(at::equal((*a)->Inputs(v1::PHASE_TRAIN, 3), (*a)->Inputs(v1::PHASE_TRAIN, 4)));
  // Each epoch is a new permutation of the same samples.
  at::Tensor epoch0 = at::cat({(*a)->Labels(v1::PHASE_TRAIN, 0), (*a)->Labels(v1::PHASE_TRAIN, 1)});
  at::Tensor epoch1 = at::cat({(*a)->Labels(v1::PHASE_TRAIN, 8), (*a)->Labels(v1::PHASE_TRAIN, 9)});
  EXPECT_FALSE(at::equal(epoch0, epoch1));
  EXPECT_EQ((*a)->BatchSize(v1::PHASE_EVAL, 0), 20);
}

TEST(Dataset, FashionMnist) {
  if (!testing::HaveFashionMnist()) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  auto d = Dataset::Open(Spec("model: convnet\ndata: fashion-mnist\nbatch_size: 64\n"), true, true);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ((*d)->train_size(), 60000);
  EXPECT_EQ((*d)->test_size(), 10000);
  EXPECT_EQ((*d)->StepsPerEpoch(), 937);  // the last, incomplete batch is dropped
  at::Tensor x = (*d)->Inputs(v1::PHASE_TRAIN, 0);
  EXPECT_EQ(x.sizes(), (at::IntArrayRef{64, 1, 28, 28}));
  EXPECT_GE(x.min().item<float>(), 0.0f);
  EXPECT_LE(x.max().item<float>(), 1.0f);
  at::Tensor y = (*d)->Labels(v1::PHASE_EVAL, 9);
  EXPECT_EQ(y.size(0), 1000);
  EXPECT_LE(y.max().item<int64_t>(), 9);
}

TEST(Dataset, MissingPathIsNamed) {
  auto d = Dataset::Open(Spec("model: convnet\ndata: {name: fashion-mnist, path: /no/such/dir}\n"), true, true);
  EXPECT_TRUE(absl::IsNotFound(d.status())) << d.status();
  EXPECT_THAT(std::string(d.status().message()), HasSubstr("/no/such/dir"));
}

TEST(Dataset, CorruptFilesAreRefused) {
  std::string dir = ::testing::TempDir() + "/fake-fashion";
  std::filesystem::create_directories(dir);
  for (const char* f : {"train-labels-idx1-ubyte.gz", "t10k-labels-idx1-ubyte.gz", "train-images-idx3-ubyte.gz",
                        "t10k-images-idx3-ubyte.gz"}) {
    std::ofstream(dir + "/" + f) << "not gzip, not idx";
  }
  auto d = Dataset::Open(Spec("model: convnet\ndata: {name: fashion-mnist, path: " + dir + "}\n"), true, true);
  EXPECT_TRUE(absl::IsInvalidArgument(d.status())) << d.status();
}

}  // namespace
}  // namespace conveyor
