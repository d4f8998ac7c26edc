// model/state_dict: state dicts and data files as LibTorch tensors, read from
// and written for PyTorch itself (fixtures: tests/model/torch_fixtures.h).
#include "model/state_dict.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include "tests/model/torch_fixtures.h"

namespace conveyor {
namespace {

using namespace testing_fixtures;  // NOLINT: test helpers
using StateDictTest = TorchFixtureTest;

std::string Bytes(const at::Tensor& t) {
  const at::Tensor c = t.detach().contiguous();
  return std::string(static_cast<const char*>(c.data_ptr()), c.numel() * c.element_size());
}

std::vector<int64_t> Vec(at::IntArrayRef v) { return v.vec(); }

void ExpectLikeFixture(const std::vector<std::pair<std::string, at::Tensor>>& tensors, const std::string& expect) {
  const std::vector<Expected> want = ReadExpect(expect);
  ASSERT_EQ(tensors.size(), want.size());
  for (std::size_t n = 0; n < want.size(); ++n) {
    const auto& [name, t] = tensors[n];
    SCOPED_TRACE(name);
    EXPECT_EQ(name, want[n].name);
    TorchDType dtype;
    ASSERT_TRUE(FromScalarType(t.scalar_type(), &dtype));
    EXPECT_EQ(TorchDTypeName(dtype), want[n].dtype);
    EXPECT_EQ(Ints(Vec(t.sizes())), want[n].shape);
    EXPECT_EQ(Ints(Vec(t.strides())), want[n].stride);
    EXPECT_EQ(std::to_string(t.storage_offset()), want[n].offset);
    EXPECT_EQ(Hex(Bytes(t)), want[n].hex);
    EXPECT_TRUE(t.device().is_cpu());
    EXPECT_FALSE(t.requires_grad());
  }
}

const at::Tensor& Get(const std::vector<std::pair<std::string, at::Tensor>>& tensors, const std::string& name) {
  for (const auto& [n, t] : tensors)
    if (n == name) return t;
  static const at::Tensor none;
  return none;
}

TEST_F(StateDictTest, ReadsPythonStateDictMappedAndCopied) {
  for (bool copy : {false, true}) {
    SCOPED_TRACE(copy ? "copied" : "mapped");
    ReadTensorsOptions options;
    options.copy = copy;
    auto tensors = ReadStateDict(Path("sd.pt"), options);
    ASSERT_TRUE(tensors.ok()) << tensors.status();
    ExpectLikeFixture(*tensors, Path("sd.txt"));
    // 'view' is base[1:4, ::2]: the same memory, as in Python.
    const at::Tensor& base = Get(*tensors, "base");
    const at::Tensor& view = Get(*tensors, "view");
    EXPECT_TRUE(view.is_alias_of(base));
    base.add_(1);
    EXPECT_TRUE(at::equal(view, base.slice(0, 1, 4).slice(1, 0, 4, 2)));
  }
}

// A mapped tensor is written to in place (an optimizer step); the file is
// not: the mapping is private, copy on write.
TEST_F(StateDictTest, WritingAMappedTensorLeavesTheFile) {
  const std::string before = Slurp(Path("sd.pt"));
  {
    auto tensors = ReadStateDict(Path("sd.pt"));
    ASSERT_TRUE(tensors.ok()) << tensors.status();
    for (auto& [name, t] : *tensors)
      if (t.is_floating_point()) t.mul_(3);
  }
  EXPECT_EQ(Slurp(Path("sd.pt")), before);
  auto again = ReadStateDict(Path("sd.pt"));
  ASSERT_TRUE(again.ok()) << again.status();
  ExpectLikeFixture(*again, Path("sd.txt"));
}

TEST_F(StateDictTest, TensorsOutliveTheirFile) {
  const std::string copy = Path("outlive.pt");
  Spit(copy, Slurp(Path("sd.pt")));
  auto tensors = ReadStateDict(copy);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  ASSERT_EQ(::unlink(copy.c_str()), 0);
  ExpectLikeFixture(*tensors, Path("sd.txt"));
}

TEST_F(StateDictTest, ReadsATensorDict) {
  auto data = ReadTensorDict(Path("td.pt"));
  ASSERT_TRUE(data.ok()) << data.status();
  ASSERT_EQ(data->size(), 2u);
  const at::Tensor& inputs = data->at("inputs");
  const at::Tensor& targets = data->at("targets");
  EXPECT_EQ(inputs.scalar_type(), at::kFloat);
  EXPECT_EQ(Vec(inputs.sizes()), (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(targets.scalar_type(), at::kLong);
  EXPECT_EQ(Vec(targets.sizes()), (std::vector<int64_t>{4}));
  const std::vector<Expected> want = ReadExpect(Path("td.txt"));
  EXPECT_EQ(Hex(Bytes(inputs)), want[0].hex);
  EXPECT_EQ(Hex(Bytes(targets)), want[1].hex);
}

TEST_F(StateDictTest, RefusalsCarryTheirReasons) {
  auto evil = ReadStateDict(Path("evil.pt"));
  EXPECT_EQ(evil.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(evil.status().message().find("refuses to call posix.system"), std::string::npos) << evil.status();
  EXPECT_NE(::access(Path("PWNED").c_str(), F_OK), 0);
  EXPECT_EQ(ReadTensorDict(Path("missing.pt")).status().code(), absl::StatusCode::kNotFound);
  const std::string bytes = Slurp(Path("td.pt"));
  Spit(Path("cut.pt"), bytes.substr(0, bytes.size() - 30));
  auto cut = ReadTensorDict(Path("cut.pt"));
  EXPECT_EQ(cut.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cut.status().message().rfind(Path("cut.pt"), 0), 0u) << cut.status();
}

// C++ writes (from tensors of every kind: a transpose, a view, bf16, a
// scalar, an empty one); torch.load(weights_only=True) gets the same values bit
// for bit and the model's load_state_dict(strict=True) takes them.
TEST_F(StateDictTest, PythonLoadsWhatItWrites) {
  auto tensors = ReadStateDict(Path("sd.pt"));
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  if (at::hasCUDA()) (*tensors)[0].second = (*tensors)[0].second.to(at::Device(at::kCUDA, 0));
  {
    std::ofstream out(Path("cpp.txt"));
    for (const auto& [name, t] : *tensors) {
      TorchDType dtype;
      ASSERT_TRUE(FromScalarType(t.scalar_type(), &dtype));
      WriteExpectLine(out, name, TorchDTypeName(dtype), Vec(t.sizes()), Bytes(t.cpu()));
    }
  }
  ASSERT_TRUE(WriteStateDict(Path("cpp.pt"), *tensors).ok());
  EXPECT_EQ(Py("check " + Quote(Path("cpp.pt")) + " " + Quote(Path("cpp.txt")) + " --model"), 0) << PyLog();
  auto back = ReadStateDict(Path("cpp.pt"));
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), tensors->size());
  for (std::size_t n = 0; n < back->size(); ++n) {
    EXPECT_EQ((*back)[n].first, (*tensors)[n].first);
    EXPECT_TRUE((*back)[n].second.is_contiguous());
    EXPECT_EQ(Bytes((*back)[n].second), Bytes((*tensors)[n].second.cpu()));
  }
}

TEST(WriteStateDictTorch, RefusesWhatTheFormatHereLacks) {
  const std::string path = "/tmp/state_dict_test_never_written.pt";
  Status st = WriteStateDict(path, {{"w", at::ones({2}).to_sparse()}});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("'w' is not strided"), std::string::npos) << st;
  st = WriteStateDict(path, {{"z", at::ones({2}, at::kComplexFloat)}});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("'z' has dtype ComplexFloat"), std::string::npos) << st;
  EXPECT_NE(::access(path.c_str(), F_OK), 0);
}

}  // namespace
}  // namespace conveyor
