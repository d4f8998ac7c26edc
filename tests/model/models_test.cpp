#include "model/models.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "common/sha256.h"
#include "model/blocks.h"
#include "model/partition.h"
#include "model/split_heads.h"
#include "model/zoo_partition.h"
#include "plan/job_spec.h"
#include "plan/model_catalog.h"
#include "tests/support/test_util.h"

namespace conveyor {
namespace {

v1::JobSpec Spec(const std::string& yaml) {
  auto spec = ParseJobYaml(yaml);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

class ModelsTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ModelsTest, CatalogAgreesWithTheBuiltModel) {
  v1::JobSpec spec = Spec(GetParam());
  auto model = BuildLayers(spec, 0, NumLayers(spec.model()));
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(static_cast<int>((*model)->size()), NumLayers(spec.model()));
  std::vector<int64_t> shape{2};
  for (int64_t d : InputSampleShape(spec)) shape.push_back(d);
  const bool tokens = InputDType(spec) == v1::DTYPE_INT64;
  (*model)->eval();
  at::Tensor out = (*model)->forward(at::zeros(shape, tokens ? at::kLong : at::kFloat));
  EXPECT_EQ(out.size(0), 2);
  EXPECT_EQ(out.size(-1), NumClasses(spec.model()));
  EXPECT_EQ(out.dim(), tokens ? 3 : 2);
}

TEST_P(ModelsTest, InitialWeightsDoNotDependOnThePartition) {
  v1::JobSpec spec = Spec(GetParam());
  const int n = NumLayers(spec.model());
  auto whole = BuildZooPartition(spec, 0, n);
  ASSERT_TRUE(whole.ok());
  NamedTensors pieces;
  for (int b = 0; b < n; b += 2) {  // two layers per "stage"
    auto part = BuildZooPartition(spec, b, std::min(n, b + 2));
    ASSERT_TRUE(part.ok());
    for (auto& p : (*part)->NamedParameters()) pieces.push_back(p);
  }
  auto all = (*whole)->NamedParameters();
  ASSERT_EQ(all.size(), pieces.size());
  for (std::size_t i = 0; i < all.size(); ++i) {
    EXPECT_EQ(all[i].first, pieces[i].first);
    EXPECT_TRUE(at::equal(all[i].second, pieces[i].second)) << all[i].first;
  }
}

INSTANTIATE_TEST_SUITE_P(Zoo, ModelsTest,
                         ::testing::Values("model: toy", "model: convnet",
                                           "model: {name: mlp, input_dim: 12, hidden: [7, 5], num_classes: 3}",
                                           "model: {name: resnet50, image_size: 32, num_classes: 7}",
                                           "model: {name: gpt, vocab: 50, width: 16, blocks: 2, heads: 4, seq_len: 8}"));

TEST(Models, ResNet50HasTorchvisionsLayoutAndTheSeedsCut) {
  v1::JobSpec spec = Spec("model: resnet50\npartition: {stages: 2}");
  EXPECT_EQ(spec.model().image_size(), 128);
  auto model = BuildLayers(spec, 0, NumLayers(spec.model()));
  ASSERT_TRUE(model.ok());
  int64_t params = 0;
  for (const auto& p : (*model)->parameters()) params += p.numel();
  EXPECT_EQ(params, 25557032);  // torchvision's resnet50
  auto ranges = PartitionLayers(spec);
  ASSERT_TRUE(ranges.ok());
  EXPECT_EQ((*ranges)[1].begin, 11);  // layer3 starts stage 2
}

TEST(Models, GptDefaultsAreTheW2Decoder) {
  v1::JobSpec spec = Spec("model: gpt");
  EXPECT_EQ(NumLayers(spec.model()), 27);
  // Count without building 1.34 B parameters: one block and the ends.
  spec.mutable_model()->set_blocks(1);
  auto model = BuildLayers(spec, 0, 4);
  ASSERT_TRUE(model.ok());
  int64_t params = 0;
  for (const auto& p : (*model)->parameters()) params += p.numel();
  const int64_t block = 12LL * 2048 * 2048 + 13 * 2048;  // attention, MLP, norms, biases
  const int64_t ends = 32000LL * 2048 + 1024 * 2048 + 2 * 2048 + 2048LL * 32000 + 32000;
  EXPECT_EQ(params, block + ends);
  EXPECT_NEAR(static_cast<double>(24 * block + ends), 1.34e9, 0.01e9);
}

// model.fused (issue 19): attention's q, k, v as views whose backward writes
// the qkv projection's gradient once take the very steps of unbind's stack
// and copy: the same values, copied once instead of twice.
TEST(Models, GptFusedQkvTakesTheUnfusedStepsBitForBit) {
  auto job = [](const char* fused) {
    return std::string("model: {name: gpt, vocab: 50, width: 32, blocks: 2, heads: 4, seq_len: 8, fused: ") + fused +
           "}\ndata: {name: synthetic, train_samples: 16, test_samples: 0}\nbatch_size: 4\nsteps: 3\n"
           "optimizer: {name: sgd, lr: 0.5}\n";
  };
  const cli::ReferenceResult fused = testing::Reference(job("true"));
  const cli::ReferenceResult plain = testing::Reference(job("false"));
  ASSERT_EQ(fused.status.losses_size(), 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(fused.status.losses(i), plain.status.losses(i)) << "step " << i + 1;
  ASSERT_EQ(fused.parameters.size(), plain.parameters.size());
  for (std::size_t i = 0; i < fused.parameters.size(); ++i)
    EXPECT_TRUE(at::equal(fused.parameters[i].second, plain.parameters[i].second)) << fused.parameters[i].first;
  EXPECT_NE(fused.status.losses(0), fused.status.losses(2));  // it trained
}

// The fused views' backward alone: gradients of q, k and v land in the
// projection's layout, and one without a gradient leaves zeros.
TEST(Models, SplitHeadsBackwardWritesEachGradientInPlace) {
  at::manual_seed(3);
  const at::Tensor qkv = at::randn({2, 5, 3 * 4 * 3}, at::kDouble).requires_grad_();
  std::vector<at::Tensor> parts = SplitHeads(qkv, 4);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[0].sizes(), at::IntArrayRef({2, 4, 5, 3}));
  const at::Tensor w0 = at::randn({2, 4, 5, 3}, at::kDouble), w2 = at::randn({2, 4, 5, 3}, at::kDouble);
  (parts[0] * w0 + parts[2] * w2).sum().backward();  // k gets no gradient
  const at::Tensor ref = qkv.detach().clone().requires_grad_();
  std::vector<at::Tensor> plain = ref.view({2, 5, 3, 4, 3}).permute({2, 0, 3, 1, 4}).unbind(0);
  (plain[0] * w0 + plain[2] * w2).sum().backward();
  EXPECT_TRUE(at::equal(parts[1], plain[1]));
  EXPECT_TRUE(at::equal(qkv.grad(), ref.grad()));
  EXPECT_EQ(qkv.grad().view({2, 5, 3, 12}).select(2, 1).abs().sum().item<double>(), 0.0);
}

TEST(Models, Bf16PrecisionBuildsBf16Parameters) {
  auto model = BuildLayers(Spec("model: toy\nprecision: bf16"), 0, 3);
  ASSERT_TRUE(model.ok());
  for (const auto& p : (*model)->parameters()) EXPECT_EQ(p.scalar_type(), at::kBFloat16);
}

// memory_format: auto is channels-last on CUDA for the convolutional models
// only; ToChannelsLast converts the convolution weights, and a channels-last
// forward equals the contiguous one within float rounding.
TEST(Models, ChannelsLastConvertsTheConvolutionWeights) {
  const at::Device cpu(at::kCPU), gpu(at::kCUDA, 0);
  EXPECT_FALSE(UsesChannelsLast(Spec("model: convnet"), cpu));
  EXPECT_TRUE(UsesChannelsLast(Spec("model: convnet"), gpu));
  EXPECT_TRUE(UsesChannelsLast(Spec("model: {name: resnet50, image_size: 32}"), gpu));
  EXPECT_FALSE(UsesChannelsLast(Spec("model: {name: gpt, vocab: 40, width: 16, blocks: 2, heads: 2, seq_len: 6}"), gpu));
  EXPECT_TRUE(UsesChannelsLast(Spec("model: convnet\nmemory_format: channels_last"), cpu));
  EXPECT_FALSE(UsesChannelsLast(Spec("model: convnet\nmemory_format: contiguous"), gpu));

  const v1::JobSpec spec = Spec("model: convnet");
  auto plain = BuildPartition(spec, 0, 12);
  auto cl = BuildPartition(spec, 0, 12);
  ASSERT_TRUE(plain.ok() && cl.ok());
  ToChannelsLast(**cl);
  int converted = 0;
  for (const at::Tensor& p : (*cl)->Parameters()) {
    if (p.dim() != 4) continue;
    EXPECT_TRUE(p.is_contiguous(at::MemoryFormat::ChannelsLast));
    if (p.size(1) > 1) EXPECT_FALSE(p.is_contiguous());  // one input channel: both layouts at once
    ++converted;
  }
  EXPECT_EQ(converted, 2);  // the two convolutions
  const at::Tensor x = at::randn({4, 1, 28, 28});
  auto a = (*plain)->ForwardOne(x);
  auto b = (*cl)->ForwardOne(x.contiguous(at::MemoryFormat::ChannelsLast));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(at::allclose(*a, *b, 1e-5, 1e-6));
}

TEST(Models, SeedChangesWeights) {
  auto a = BuildLayers(Spec("model: toy\nseed: 1"), 0, 3);
  auto b = BuildLayers(Spec("model: toy\nseed: 2"), 0, 3);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_FALSE(at::equal((*a)->parameters()[0], (*b)->parameters()[0]));
}

TEST(Models, DigestIsPerLayerAndIndependentOfThePartition) {
  v1::JobSpec spec = Spec("model: convnet");
  auto whole = BuildZooPartition(spec, 0, 12);
  auto head = BuildZooPartition(spec, 0, 5);
  auto tail = BuildZooPartition(spec, 5, 12);
  ASSERT_TRUE(whole.ok() && head.ok() && tail.ok());
  auto digests = [](const Partition& p, std::vector<std::string>* out) {
    for (int i = 0; i < p.num_layers(); ++i) out->push_back(p.LayerDigest(i));
  };
  std::vector<std::string> one, two;
  digests(**whole, &one);
  digests(**head, &two);
  digests(**tail, &two);
  EXPECT_EQ(CombineDigests(one), CombineDigests(two));
  EXPECT_EQ(CombineDigests(one).size(), 64u);
  // A changed weight changes the digest.
  {
    at::NoGradGuard g;
    (*tail)->Parameters()[0].add_(1e-3);
  }
  two.clear();
  digests(**head, &two);
  digests(**tail, &two);
  EXPECT_NE(CombineDigests(one), CombineDigests(two));
}

TEST(Models, BadRangeIsAnError) {
  auto m = BuildLayers(Spec("model: toy"), 2, 5);
  EXPECT_TRUE(absl::IsInvalidArgument(m.status()));
}

}  // namespace
}  // namespace conveyor
