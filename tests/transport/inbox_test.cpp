#include "transport/inbox.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <future>

namespace conveyor {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

InboxExpectations Expect() {
  InboxExpectations e;
  e.job_id = "job-1";
  e.stage_index = 2;
  e.num_stages = 4;
  e.activation_shapes[2] = {3};
  e.gradient_shapes[2] = {5};
  e.max_micro_batches = 4;
  e.max_micro_batch_size = 2;
  return e;
}

v1::TensorFrame HeaderFrame(v1::FrameKind kind, int64_t step, int mb, std::vector<int64_t> shape,
                      v1::DType dtype = v1::DTYPE_FLOAT32) {
  v1::TensorFrame f;
  f.set_job_id("job-1");
  f.set_phase(v1::PHASE_TRAIN);
  f.set_step(step);
  f.set_micro_batch(mb);
  f.set_kind(kind);
  f.set_chunk(2);
  f.mutable_tensor()->set_dtype(dtype);
  int64_t n = 4;
  for (int64_t d : shape) {
    f.mutable_tensor()->add_shape(d);
    n *= d;
  }
  f.mutable_tensor()->mutable_data()->resize(static_cast<std::size_t>(n));
  return f;
}

// A tuple crossing: each tensor is a frame of its own (its part), checked
// against its own dtype and shape; gradients only for the parts that take one.
TEST(Inbox, ChecksEachTensorOfATupleByPart) {
  InboxExpectations e = Expect();
  e.activation_parts[2][0] = {v1::DTYPE_FLOAT32, {3}};
  e.activation_parts[2][1] = {v1::DTYPE_BOOL, {3, 3}};
  e.gradient_parts[2][0] = {v1::DTYPE_FLOAT32, {5}};
  Inbox inbox;
  inbox.Open(e);
  inbox.BeginStep(v1::PHASE_TRAIN, 0);
  v1::TensorFrame mask = HeaderFrame(v1::FRAME_ACTIVATION, 0, 1, {2, 3, 3}, v1::DTYPE_BOOL);
  mask.set_part(1);
  mask.mutable_tensor()->mutable_data()->resize(2 * 3 * 3);  // a byte per bool
  ASSERT_TRUE(inbox.Deliver(mask).ok());
  ASSERT_TRUE(inbox.Deliver(HeaderFrame(v1::FRAME_ACTIVATION, 0, 1, {2, 3})).ok());
  auto got = inbox.Take(v1::FRAME_ACTIVATION, 2, 1, Clock::now() + std::chrono::seconds(30), /*part=*/1);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->header.part(), 1);
  EXPECT_EQ(got->header.tensor().dtype(), v1::DTYPE_BOOL);
  got = inbox.Take(v1::FRAME_ACTIVATION, 2, 1, Clock::now() + std::chrono::seconds(30), /*part=*/0);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->header.part(), 0);

  v1::TensorFrame wrong = HeaderFrame(v1::FRAME_ACTIVATION, 0, 2, {2, 3, 3});  // float where bool is expected
  wrong.set_part(1);
  Status st = inbox.Deliver(wrong);
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("activation tensor 1"));
  inbox.BeginStep(v1::PHASE_TRAIN, 1);
  v1::TensorFrame third = HeaderFrame(v1::FRAME_ACTIVATION, 1, 0, {2, 3});
  third.set_part(2);
  st = inbox.Deliver(third);
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("expects no activation tensor 2 for chunk 2"));
  // The mask takes no gradient: part 1 of a gradient is refused.
  v1::TensorFrame grad = HeaderFrame(v1::FRAME_GRADIENT, 1, 0, {2, 3, 3}, v1::DTYPE_BOOL);
  grad.set_part(1);
  grad.mutable_tensor()->mutable_data()->resize(2 * 3 * 3);
  st = inbox.Deliver(grad);
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("expects no gradient tensor 1"));
}

TEST(Inbox, DeliversWhatTheStageWaitsFor) {
  Inbox inbox;
  inbox.Open(Expect());
  inbox.BeginStep(v1::PHASE_TRAIN, 0);
  auto taker = std::async(std::launch::async, [&] {
    return inbox.Take(v1::FRAME_ACTIVATION, 2, 1, Clock::now() + std::chrono::seconds(30));
  });
  ASSERT_TRUE(inbox.Deliver(HeaderFrame(v1::FRAME_ACTIVATION, 0, 1, {2, 3})).ok());
  auto frame = taker.get();
  ASSERT_TRUE(frame.ok()) << frame.status();
  EXPECT_EQ(frame->header.micro_batch(), 1);
  // The next step's frames may come early; older ones are refused.
  EXPECT_TRUE(inbox.Deliver(HeaderFrame(v1::FRAME_GRADIENT, 1, 0, {2, 5})).ok());
  inbox.BeginStep(v1::PHASE_TRAIN, 1);
  EXPECT_EQ(inbox.held(), 1u);
  Status stale = inbox.Deliver(HeaderFrame(v1::FRAME_ACTIVATION, 0, 2, {2, 3}));
  EXPECT_TRUE(absl::IsFailedPrecondition(stale)) << stale;
  EXPECT_THAT(std::string(stale.message()), HasSubstr("does not expect tensors of step 0"));
}

// Evaluations between epochs: a neighbour may start the evaluation, or the
// training step after it, before this stage does.
TEST(Inbox, FramesOfTheNextPhaseMayComeEarly) {
  Inbox inbox;
  inbox.Open(Expect());
  inbox.BeginStep(v1::PHASE_TRAIN, 4);
  v1::TensorFrame eval0 = HeaderFrame(v1::FRAME_ACTIVATION, 0, 0, {2, 3});
  eval0.set_phase(v1::PHASE_EVAL);
  EXPECT_TRUE(inbox.Deliver(eval0).ok());
  inbox.BeginStep(v1::PHASE_EVAL, 0);
  inbox.BeginStep(v1::PHASE_EVAL, 1);
  EXPECT_TRUE(inbox.Deliver(HeaderFrame(v1::FRAME_ACTIVATION, 5, 0, {2, 3})).ok());
  Status later = inbox.Deliver(HeaderFrame(v1::FRAME_ACTIVATION, 6, 0, {2, 3}));
  EXPECT_TRUE(absl::IsFailedPrecondition(later)) << later;
  inbox.BeginStep(v1::PHASE_TRAIN, 5);
  auto frame = inbox.Take(v1::FRAME_ACTIVATION, 2, 0, Clock::now() + std::chrono::seconds(30));
  ASSERT_TRUE(frame.ok()) << frame.status();
  EXPECT_EQ(frame->header.step(), 5);
}

// steps_in_flight: 2: a neighbour may send step N+2 before this stage has
// begun N+1 (here: steps 0 and 1 before this stage's first step), and with
// accumulate_steps K each of those steps' K batches; no further.
TEST(Inbox, WithTwoStepsInFlightANeighbourMayBeTwoStepsAhead) {
  for (int batches : {1, 3}) {
    InboxExpectations e = Expect();
    e.steps_in_flight = 2;
    e.batches_per_step = batches;
    Inbox inbox;
    inbox.Open(e);
    for (int64_t step = 0; step < 2 * batches; ++step)
      EXPECT_TRUE(inbox.Deliver(HeaderFrame(v1::FRAME_ACTIVATION, step, 0, {2, 3})).ok()) << step;
    Status far = inbox.Deliver(HeaderFrame(v1::FRAME_ACTIVATION, 2 * batches, 0, {2, 3}));
    EXPECT_TRUE(absl::IsFailedPrecondition(far)) << far;
    inbox.BeginStep(v1::PHASE_TRAIN, 0);
    EXPECT_EQ(inbox.held(), static_cast<std::size_t>(2 * batches));
  }
  // One step at a time: the next step's only.
  Inbox inbox;
  inbox.Open(Expect());
  EXPECT_TRUE(inbox.Deliver(HeaderFrame(v1::FRAME_ACTIVATION, 0, 0, {2, 3})).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(inbox.Deliver(HeaderFrame(v1::FRAME_ACTIVATION, 1, 0, {2, 3}))));
}

TEST(Inbox, RefusesBadFramesWithTheReason) {
  Inbox inbox;
  inbox.Open(Expect());
  inbox.BeginStep(v1::PHASE_TRAIN, 0);
  struct Case {
    v1::TensorFrame frame;
    absl::StatusCode code;
    const char* message;
  };
  v1::TensorFrame other_job = HeaderFrame(v1::FRAME_ACTIVATION, 0, 0, {2, 3});
  other_job.set_job_id("job-9");
  v1::TensorFrame short_data = HeaderFrame(v1::FRAME_ACTIVATION, 0, 0, {2, 3});
  short_data.mutable_tensor()->mutable_data()->resize(3);
  v1::TensorFrame wrong_chunk = HeaderFrame(v1::FRAME_ACTIVATION, 0, 0, {2, 3});
  wrong_chunk.set_chunk(6);
  Case cases[] = {
      {wrong_chunk, absl::StatusCode::kInvalidArgument, "no activation tensors for chunk 6"},
      {HeaderFrame(v1::FRAME_ACTIVATION, 0, 0, {2, 4}), absl::StatusCode::kInvalidArgument, "has shape [2, 4], expected [2, 3]"},
      {HeaderFrame(v1::FRAME_ACTIVATION, 0, 0, {2, 3}, v1::DTYPE_BFLOAT16), absl::StatusCode::kInvalidArgument,
       "dtype bfloat16, expected float32"},
      {HeaderFrame(v1::FRAME_GRADIENT, 0, 0, {9, 5}), absl::StatusCode::kInvalidArgument, "expected [2, 5]"},
      {HeaderFrame(v1::FRAME_ACTIVATION, 0, 7, {2, 3}), absl::StatusCode::kInvalidArgument, "micro-batch 7 is out of range"},
      {HeaderFrame(v1::FRAME_UNSPECIFIED, 0, 0, {2, 3}), absl::StatusCode::kInvalidArgument, "no kind"},
      {HeaderFrame(v1::FRAME_ACTIVATION, 5, 0, {2, 3}), absl::StatusCode::kFailedPrecondition, "step 5"},
      {other_job, absl::StatusCode::kFailedPrecondition, "runs job 'job-1', not 'job-9'"},
      {short_data, absl::StatusCode::kInvalidArgument, "carries 3 bytes"},
  };
  for (auto& c : cases) {
    Status st = inbox.Deliver(c.frame);
    EXPECT_EQ(st.code(), c.code) << st;
    EXPECT_THAT(std::string(st.message()), HasSubstr(c.message));
  }
  Inbox closed;
  EXPECT_TRUE(absl::IsFailedPrecondition(closed.Deliver(HeaderFrame(v1::FRAME_ACTIVATION, 0, 0, {2, 3}))));
}

TEST(Inbox, ABadTensorFailsTheWaitingStep) {
  Inbox inbox;
  inbox.Open(Expect());
  inbox.BeginStep(v1::PHASE_TRAIN, 0);
  auto taker = std::async(std::launch::async, [&] {
    return inbox.Take(v1::FRAME_ACTIVATION, 2, 0, Clock::now() + std::chrono::seconds(60));
  });
  EXPECT_FALSE(inbox.Deliver(HeaderFrame(v1::FRAME_ACTIVATION, 0, 0, {2, 4})).ok());
  auto result = taker.get();
  EXPECT_TRUE(absl::IsInvalidArgument(result.status())) << result.status();
}

// Zero-bubble asks whether its next frame is here before it waits for it.
TEST(Inbox, ReadySaysWhetherTakeWouldReturnAtOnceAndTakesNothing) {
  Inbox inbox;
  inbox.Open(Expect());
  inbox.BeginStep(v1::PHASE_TRAIN, 0);
  EXPECT_FALSE(inbox.Ready(v1::FRAME_ACTIVATION, 2, 1));
  ASSERT_TRUE(inbox.Deliver(HeaderFrame(v1::FRAME_ACTIVATION, 0, 1, {2, 3})).ok());
  EXPECT_TRUE(inbox.Ready(v1::FRAME_ACTIVATION, 2, 1));
  EXPECT_TRUE(inbox.Ready(v1::FRAME_ACTIVATION, 2, 1));  // still there
  EXPECT_FALSE(inbox.Ready(v1::FRAME_ACTIVATION, 2, 0));
  EXPECT_FALSE(inbox.Ready(v1::FRAME_GRADIENT, 2, 1));
  ASSERT_TRUE(inbox.Take(v1::FRAME_ACTIVATION, 2, 1, Clock::now()).ok());
  EXPECT_FALSE(inbox.Ready(v1::FRAME_ACTIVATION, 2, 1));
  inbox.Fail(absl::UnavailableError("stage 1 is gone"));
  EXPECT_TRUE(inbox.Ready(v1::FRAME_GRADIENT, 2, 1)) << "a failed inbox: Take() returns the failure at once";
}

TEST(Inbox, DuplicateFramesAreRefused) {
  Inbox inbox;
  inbox.Open(Expect());
  ASSERT_TRUE(inbox.Deliver(HeaderFrame(v1::FRAME_ACTIVATION, 0, 0, {2, 3})).ok());
  EXPECT_TRUE(absl::IsAlreadyExists(inbox.Deliver(HeaderFrame(v1::FRAME_ACTIVATION, 0, 0, {2, 3}))));
}

TEST(Inbox, TimeoutNamesTheActionAndThePeer) {
  Inbox inbox;
  inbox.Open(Expect());
  inbox.BeginStep(v1::PHASE_TRAIN, 3);
  auto r = inbox.Take(v1::FRAME_GRADIENT, 2, 1, Clock::now());
  EXPECT_TRUE(absl::IsDeadlineExceeded(r.status()));
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("stage 2 waited too long for the gradient of step 3 micro-batch 1 from stage 3 (downstream)"));
}

TEST(Inbox, FailWakesAWaitingTake) {
  Inbox inbox;
  inbox.Open(Expect());
  inbox.BeginStep(v1::PHASE_TRAIN, 0);
  auto taker = std::async(std::launch::async, [&] {
    return inbox.Take(v1::FRAME_ACTIVATION, 2, 0, Clock::now() + std::chrono::seconds(60));
  });
  inbox.Fail(absl::AbortedError("stop"));
  EXPECT_TRUE(absl::IsAborted(taker.get().status()));
  inbox.BeginStep(v1::PHASE_TRAIN, 1);  // a new step clears the failure
  ASSERT_TRUE(inbox.Deliver(HeaderFrame(v1::FRAME_ACTIVATION, 1, 0, {2, 3})).ok());
  EXPECT_TRUE(inbox.Take(v1::FRAME_ACTIVATION, 2, 0, Clock::now()).ok());
}

TEST(Inbox, ASpinningTakeSeesAFrameDeliveredMeanwhile) {
  Inbox inbox;
  inbox.Open(Expect());
  inbox.SetSpin(std::chrono::seconds(600));  // past the deadline: it never sleeps
  inbox.BeginStep(v1::PHASE_TRAIN, 0);
  auto taker = std::async(std::launch::async, [&] {
    return inbox.Take(v1::FRAME_ACTIVATION, 2, 1, Clock::now() + std::chrono::seconds(60));
  });
  ASSERT_TRUE(inbox.Deliver(HeaderFrame(v1::FRAME_ACTIVATION, 0, 0, {2, 3})).ok());  // not the awaited one
  ASSERT_TRUE(inbox.Deliver(HeaderFrame(v1::FRAME_ACTIVATION, 0, 1, {2, 3})).ok());
  auto frame = taker.get();
  ASSERT_TRUE(frame.ok()) << frame.status();
  EXPECT_EQ(frame->header.micro_batch(), 1);
  EXPECT_EQ(inbox.held(), 1u);
}

TEST(Inbox, ASpinningTakeStillEndsAtItsDeadline) {
  Inbox inbox;
  inbox.Open(Expect());
  inbox.SetSpin(std::chrono::seconds(600));
  inbox.BeginStep(v1::PHASE_TRAIN, 0);
  auto r = inbox.Take(v1::FRAME_GRADIENT, 2, 0, Clock::now() + std::chrono::milliseconds(1));
  EXPECT_TRUE(absl::IsDeadlineExceeded(r.status())) << r.status();
}

}  // namespace
}  // namespace conveyor
