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

// replicas: each replica reads its own rows of every batch, and between them
// the whole batch (DistributedSampler's semantics: over an epoch, every
// sample once); evaluation batches stay whole.
TEST(Dataset, ReplicasReadDisjointSharesOfEachBatch) {
  const std::string yaml = "model: toy\nbatch_size: 8\nreplicas: 2\nmicro_batches: 2\n"
                           "data: {name: synthetic, train_samples: 64, test_samples: 20}\n";
  v1::JobSpec spec = Spec(yaml);
  auto whole = Dataset::Open(spec, true, true);
  auto r0 = Dataset::Open(spec, true, true);
  auto r1 = Dataset::Open(spec, true, true);
  ASSERT_TRUE(whole.ok() && r0.ok() && r1.ok());
  (*r0)->ReadShare(0);
  (*r1)->ReadShare(1);
  // The whole batches walk a permutation of the split; the shares split each.
  for (int64_t step = 0; step < (*whole)->StepsPerEpoch(); ++step) {
    const at::Tensor a = (*r0)->Inputs(v1::PHASE_TRAIN, step), b = (*r1)->Inputs(v1::PHASE_TRAIN, step);
    ASSERT_EQ(a.size(0), 4);
    ASSERT_EQ(b.size(0), 4);
    EXPECT_TRUE(at::equal(at::cat({a, b}), (*whole)->Inputs(v1::PHASE_TRAIN, step))) << step;
    EXPECT_TRUE(at::equal(at::cat({(*r0)->Labels(v1::PHASE_TRAIN, step), (*r1)->Labels(v1::PHASE_TRAIN, step)}),
                          (*whole)->Labels(v1::PHASE_TRAIN, step)))
        << step;
  }
  EXPECT_EQ((*r1)->Inputs(v1::PHASE_EVAL, 0).size(0), 20);
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
  const testing::ScopedTempDir folder("fake-fashion");
  const std::string& dir = folder.path();
  for (const char* f : {"train-labels-idx1-ubyte.gz", "t10k-labels-idx1-ubyte.gz", "train-images-idx3-ubyte.gz",
                        "t10k-images-idx3-ubyte.gz"}) {
    std::ofstream(dir + "/" + f) << "not gzip, not idx";
  }
  auto d = Dataset::Open(Spec("model: convnet\ndata: {name: fashion-mnist, path: " + dir + "}\n"), true, true);
  EXPECT_TRUE(absl::IsInvalidArgument(d.status())) << d.status();
}

// A flat token file DIR/NAME of `tokens` ids, little-endian, `width` bytes each.
template <typename T>
std::string WriteTokens(const std::string& dir, const std::string& name, const std::vector<T>& tokens) {
  const std::string path = dir + "/" + name;
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(tokens.size() * sizeof(T)));
  return path;
}

std::string TokensJob(const std::string& path, const std::string& dtype, int seq_len, int batch, bool shuffle) {
  return "model: {name: gpt, vocab: 70000, width: 8, blocks: 1, heads: 2, seq_len: 8}\nbatch_size: " +
         std::to_string(batch) + "\ndata: {format: tokens, train: " + path + ", test: " + path + ", dtype: " + dtype +
         ", seq_len: " + std::to_string(seq_len) + (shuffle ? "" : ", shuffle: false") + "}\n";
}

TEST(Dataset, TokenWindowsAndShiftedTargets) {
  const testing::ScopedTempDir folder("tokens");
  std::vector<uint16_t> ids(23);
  for (std::size_t k = 0; k < ids.size(); ++k) ids[k] = static_cast<uint16_t>(1000 + 7 * k);
  const std::string path = WriteTokens(folder.path(), "tokens23.bin", ids);
  auto d = Dataset::Open(Spec(TokensJob(path, "uint16", 5, 2, /*shuffle=*/false)), true, true);
  ASSERT_TRUE(d.ok()) << d.status();
  // 23 tokens: windows at 0, 5, 10, 15 (the last one's target ends at token
  // 20); tokens 20..22 are a tail too short for a fifth.
  EXPECT_EQ((*d)->train_size(), 4);
  EXPECT_EQ((*d)->StepsPerEpoch(), 2);
  at::Tensor x = (*d)->Inputs(v1::PHASE_TRAIN, 1), y = (*d)->Labels(v1::PHASE_TRAIN, 1);
  EXPECT_EQ(x.scalar_type(), at::kLong);
  EXPECT_EQ(x.sizes(), (at::IntArrayRef{2, 5}));
  at::Tensor all = at::arange(0, 23, at::kLong) * 7 + 1000;
  EXPECT_TRUE(at::equal(x, all.slice(0, 10, 20).view({2, 5})));  // samples 2 and 3, in file order
  EXPECT_TRUE(at::equal(y, all.slice(0, 11, 21).view({2, 5})));  // the same windows, one token later
  EXPECT_TRUE(at::equal((*d)->SampleOf(true), all.slice(0, 0, 5)));
  EXPECT_TRUE(at::equal((*d)->SampleOf(false), all.slice(0, 1, 6)));
  // Test batches walk the file in order too.
  EXPECT_TRUE(at::equal((*d)->Labels(v1::PHASE_EVAL, 0), all.slice(0, 1, 21).view({4, 5})));

  // (T - 1) / N: 21 tokens still give 4 windows, 20 give 3.
  for (auto [n, want] : {std::pair<std::size_t, int64_t>{21, 4}, {20, 3}, {6, 1}, {5, 0}}) {
    const std::string p = WriteTokens(folder.path(), "tokens" + std::to_string(n) + ".bin",
                                      std::vector<uint16_t>(ids.begin(), ids.begin() + n));
    auto e = Dataset::Open(Spec(TokensJob(p, "uint16", 5, 1, false)), true, true);
    if (want == 0) {
      EXPECT_TRUE(absl::IsInvalidArgument(e.status())) << e.status();  // batch_size 1 > 0 samples
      continue;
    }
    ASSERT_TRUE(e.ok()) << e.status();
    EXPECT_EQ((*e)->train_size(), want) << n << " tokens";
  }

  // Shuffled: each row is some window, its target the same window shifted.
  auto s = Dataset::Open(Spec(TokensJob(path, "uint16", 5, 4, /*shuffle=*/true)), true, true);
  ASSERT_TRUE(s.ok()) << s.status();
  x = (*s)->Inputs(v1::PHASE_TRAIN, 0);
  y = (*s)->Labels(v1::PHASE_TRAIN, 0);
  at::Tensor starts = (x.select(1, 0) - 1000).div(7, "floor");
  EXPECT_TRUE(at::equal(starts.remainder(5), at::zeros({4}, at::kLong)));
  EXPECT_TRUE(at::equal(std::get<0>(starts.sort()), at::arange(0, 20, 5, at::kLong)));  // all four, once
  EXPECT_TRUE(at::equal(y, x + 7));
}

TEST(Dataset, Uint32TokenIdsPast2To31StayPositive) {
  const testing::ScopedTempDir folder("tokens");
  const std::vector<uint32_t> ids = {0xFFFFFFF0u, 1, 0x80000000u, 2, 3};
  const std::string path = WriteTokens(folder.path(), "tokens32.bin", ids);
  auto d = Dataset::Open(Spec(TokensJob(path, "uint32", 2, 2, false)), true, true);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(at::equal((*d)->Inputs(v1::PHASE_TRAIN, 0),
                        at::tensor(std::vector<int64_t>{4294967280LL, 1, 2147483648LL, 2}, at::kLong).view({2, 2})));
  EXPECT_TRUE(at::equal((*d)->Labels(v1::PHASE_TRAIN, 0),
                        at::tensor(std::vector<int64_t>{1, 2147483648LL, 2, 3}, at::kLong).view({2, 2})));
}

TEST(Dataset, ATokenFileOfAPartialTokenIsNamed) {
  const testing::ScopedTempDir folder("tokens");
  const std::string path = folder.path() + "/odd-tokens.bin";
  std::ofstream(path, std::ios::binary) << std::string(47, 'x');  // 23.5 uint16 ids
  v1::JobSpec spec = Spec(TokensJob(path, "uint16", 5, 2, false));
  auto d = Dataset::Open(spec, true, true);
  EXPECT_TRUE(absl::IsInvalidArgument(d.status())) << d.status();
  EXPECT_THAT(std::string(d.status().message()),
              HasSubstr("data.train: " + path + " is 47 bytes, not a whole number of uint16 token ids (2 bytes each)"));
  // The same before anything is placed: at submission (ResolveJobPaths) ...
  Status st = ResolveJobPaths(&spec, {});
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("odd-tokens.bin is 47 bytes, not a whole number"));
  // ... and 47 bytes are no whole number of uint32 ids either; 48 are.
  EXPECT_FALSE(Dataset::Open(Spec(TokensJob(path, "uint32", 5, 2, false)), true, true).ok());
}

}  // namespace
}  // namespace conveyor
