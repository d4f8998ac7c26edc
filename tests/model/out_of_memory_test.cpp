// model/out_of_memory.h: an allocation that failed is RESOURCE_EXHAUSTED
// naming the context, what was held and the allocator's message; any other
// LibTorch error keeps the caller's code. The stage's end of it, on a GPU
// with a job too large for it: tests/gpu/gpu_test.cpp.
#include "model/out_of_memory.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <new>
#include <optional>
#include <stdexcept>

#include "model/optimizer.h"

namespace conveyor {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// The CUDA caching allocator's error, as LibTorch throws it (built by hand:
// there is no GPU here).
c10::OutOfMemoryError CudaOutOfMemory() {
  return c10::OutOfMemoryError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                               "CUDA out of memory. Tried to allocate 250.00 GiB (GPU 0; 79.11 GiB total capacity)");
}

TEST(OutOfMemory, CudaAllocatorErrorIsResourceExhausted) {
  const c10::OutOfMemoryError e = CudaOutOfMemory();
  EXPECT_TRUE(IsOutOfMemory(e));
  const absl::Status st = TorchErrorStatus(e, absl::StatusCode::kInternal, "stage 1 step 0, forward of micro-batch 2",
                                           "holding parameters 90.0 MiB");
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_THAT(st.message(), HasSubstr("stage 1 step 0, forward of micro-batch 2: out of memory"));
  EXPECT_THAT(st.message(), HasSubstr("holding parameters 90.0 MiB"));
  EXPECT_THAT(st.message(), HasSubstr("Tried to allocate 250.00 GiB"));
  EXPECT_THAT(st.message(), Not(HasSubstr("Exception raised from")));  // no backtrace
}

// A real allocation the CPU allocator refuses: a petabyte is past any
// machine's address space, so nothing is ever touched.
TEST(OutOfMemory, CpuAllocatorRefusalIsResourceExhausted) {
  std::optional<absl::Status> st;
  try {
    at::Tensor t = at::empty({int64_t{1} << 50}, at::kByte);
    FAIL() << "a petabyte was allocated";
  } catch (const c10::Error& e) {
    EXPECT_TRUE(IsOutOfMemory(e)) << e.what_without_backtrace();
    st = TorchErrorStatus(e, absl::StatusCode::kInternal, "stage 0 step 3");
  } catch (const std::bad_alloc& e) {
    EXPECT_TRUE(IsOutOfMemory(e));
    st = TorchErrorStatus(e, absl::StatusCode::kInternal, "stage 0 step 3");
  }
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(st->code(), absl::StatusCode::kResourceExhausted) << *st;
  EXPECT_THAT(st->message(), HasSubstr("stage 0 step 3: out of memory; the allocation that failed: "));
}

TEST(OutOfMemory, BadAllocIsResourceExhausted) {
  const absl::Status st = TorchErrorStatus(std::bad_alloc(), absl::StatusCode::kInvalidArgument, "stage 2");
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_THAT(st.message(), HasSubstr("bad_alloc"));
}

TEST(OutOfMemory, OtherErrorsKeepTheirCode) {
  try {
    at::mm(at::ones({2, 3}), at::ones({2, 3}));
    FAIL() << "mm of 2x3 by 2x3 worked";
  } catch (const c10::Error& e) {
    EXPECT_FALSE(IsOutOfMemory(e));
    const absl::Status st = TorchErrorStatus(e, absl::StatusCode::kInvalidArgument, "stage 0 chunk 0");
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_THAT(st.message(), HasSubstr("stage 0 chunk 0: "));
    EXPECT_THAT(st.message(), Not(HasSubstr("out of memory")));
  }
  EXPECT_FALSE(IsOutOfMemory(std::runtime_error("no such file")));
  // The TorchScript interpreter rethrows a layer's error as a std::runtime_error.
  EXPECT_TRUE(IsOutOfMemory(std::runtime_error(
      "The following operation failed in the TorchScript interpreter.\nTraceback of TorchScript (most recent call "
      "last):\nRuntimeError: DefaultCPUAllocator: can't allocate memory: you tried to allocate 281474976710656 bytes.")));
}

TEST(OutOfMemory, ByteStrings) {
  EXPECT_EQ(ByteString(512), "512 B");
  EXPECT_EQ(ByteString(2600), "2.5 KiB");
  EXPECT_EQ(ByteString(12 << 20), "12.0 MiB");
  EXPECT_EQ(ByteString(int64_t{3} << 29), "1.50 GiB");
}

// What the answer says the optimizer holds: SGD's momentum buffers once a
// step made them, Adam's two moments.
TEST(OutOfMemory, OptimizerStateBytes) {
  at::Tensor w = at::ones({10, 10}).requires_grad_(true);
  NamedTensors params{{"w", w}};
  v1::OptimizerSpec sgd;
  sgd.set_kind(v1::OPTIMIZER_SGD);
  sgd.set_lr(0.1);
  sgd.set_momentum(0.9);
  auto opt = MakeOptimizer(sgd, params);
  EXPECT_EQ(OptimizerStateBytes(*opt), 0);
  w.sum().backward();
  opt->step();
  EXPECT_EQ(OptimizerStateBytes(*opt), 400);
  v1::OptimizerSpec adam = sgd;
  adam.set_kind(v1::OPTIMIZER_ADAM);
  adam.set_beta1(0.9);
  adam.set_beta2(0.999);
  adam.set_eps(1e-8);
  auto adam_opt = MakeOptimizer(adam, params);
  adam_opt->step();
  EXPECT_EQ(OptimizerStateBytes(*adam_opt), 800);
}

}  // namespace
}  // namespace conveyor
