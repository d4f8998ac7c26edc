#include "common/wire.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "transport/tensor_codec.h"

namespace conveyor {
namespace {

using ::testing::HasSubstr;

TEST(Wire, RoundTripKeepsValuesShapeAndDtype) {
  for (auto dtype : {at::kFloat, at::kDouble, at::kBFloat16, at::kLong}) {
    at::Tensor t = at::arange(24, at::kFloat).reshape({2, 3, 4}).to(dtype);
    v1::Tensor wire;
    ASSERT_TRUE(EncodeTensor(t.transpose(1, 2), &wire).ok());  // non-contiguous input
    ASSERT_TRUE(CheckWireTensor(wire, wire.dtype(), {2, 4, 3}, "t").ok());
    at::Tensor back = DecodeTensor(&wire);
    EXPECT_EQ(back.scalar_type(), dtype);
    EXPECT_TRUE(at::equal(back, t.transpose(1, 2)));
  }
}

TEST(Wire, ChecksNameTheProblem) {
  v1::Tensor wire;
  ASSERT_TRUE(EncodeTensor(at::zeros({4, 5}), &wire).ok());
  Status st = CheckWireTensor(wire, v1::DTYPE_FLOAT32, {4, 6}, "stage 1 activation");
  EXPECT_TRUE(absl::IsInvalidArgument(st));
  EXPECT_THAT(std::string(st.message()), HasSubstr("stage 1 activation has shape [4, 5], expected [4, 6]"));
  st = CheckWireTensor(wire, v1::DTYPE_BFLOAT16, {4, 5}, "x");
  EXPECT_THAT(std::string(st.message()), HasSubstr("dtype float32, expected bfloat16"));
  wire.mutable_data()->resize(7);
  st = CheckWireTensor(wire, v1::DTYPE_FLOAT32, {4, 5}, "x");
  EXPECT_THAT(std::string(st.message()), HasSubstr("carries 7 bytes, its shape needs 80"));
}

TEST(Wire, UnsupportedDtypeIsRefused) {
  v1::Tensor wire;
  Status st = EncodeTensor(at::zeros({2}, at::kComplexFloat), &wire);
  EXPECT_TRUE(absl::IsInvalidArgument(st));
}

}  // namespace
}  // namespace conveyor
