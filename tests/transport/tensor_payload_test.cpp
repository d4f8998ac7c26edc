// transport/tensor_payload.h: a channels-last activation crosses as its bytes
// are (N, H, W, C), flagged in its header, and arrives with channels-last
// strides and the same values, whichever way its bytes came: the sender's
// tensor itself (in-process, loopback), or bytes in a buffer of the header's
// shape (the gRPC stream, NCCL).
#include "transport/tensor_payload.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstring>

namespace conveyor {
namespace {

Frame FrameOf(const at::Tensor& t) {
  Frame f;
  f.header.mutable_tensor()->set_dtype(v1::DTYPE_FLOAT32);
  for (int64_t d : t.sizes()) f.header.mutable_tensor()->add_shape(d);
  f.header.mutable_tensor()->set_channels_last(SendsChannelsLast(t));
  f.payload = MakeTensorPayload(t);
  return f;
}

// The frame as a receiver over the wire gets it: only its bytes.
Frame OverTheWire(Frame& sent) {
  const at::Tensor& bytes = dynamic_cast<TensorPayload&>(*sent.payload).tensor();
  EXPECT_TRUE(bytes.is_contiguous());
  std::string data(static_cast<std::size_t>(bytes.numel() * bytes.element_size()), '\0');
  std::memcpy(data.data(), bytes.data_ptr(), data.size());
  Frame f;
  f.header = sent.header;
  f.payload = std::make_unique<HostPayload>(std::move(data));
  return f;
}

TEST(TensorPayload, ChannelsLastCrossesWithoutConversion) {
  const at::Tensor x = at::randn({2, 3, 4, 5}).contiguous(at::MemoryFormat::ChannelsLast);
  ASSERT_TRUE(SendsChannelsLast(x));
  Frame f = FrameOf(x);
  EXPECT_TRUE(f.header.tensor().channels_last());
  // No copy: the payload holds the sender's own memory.
  EXPECT_EQ(dynamic_cast<TensorPayload&>(*f.payload).tensor().data_ptr(), x.data_ptr());
  Frame wire = OverTheWire(f);
  for (Frame* frame : {&f, &wire}) {
    const at::Tensor got = TakeTensor(*frame, at::kCPU);
    EXPECT_EQ(got.sizes(), x.sizes());
    EXPECT_TRUE(got.is_contiguous(at::MemoryFormat::ChannelsLast));
    EXPECT_TRUE(at::equal(got, x));
  }
}

TEST(TensorPayload, ContiguousAndOtherTensorsCrossAsBefore) {
  const at::Tensor nchw = at::randn({2, 3, 4, 5});
  const at::Tensor transposed = at::randn({5, 4}).t();
  const at::Tensor one_channel = at::randn({2, 1, 4, 5}).contiguous(at::MemoryFormat::ChannelsLast);
  for (const at::Tensor& x : {nchw, transposed, one_channel}) {
    EXPECT_FALSE(SendsChannelsLast(x));
    Frame f = FrameOf(x);
    EXPECT_FALSE(f.header.tensor().channels_last());
    Frame wire = OverTheWire(f);
    for (Frame* frame : {&f, &wire}) {
      const at::Tensor got = TakeTensor(*frame, at::kCPU);
      EXPECT_TRUE(got.is_contiguous());
      EXPECT_TRUE(at::equal(got, x));
    }
  }
}

}  // namespace
}  // namespace conveyor
