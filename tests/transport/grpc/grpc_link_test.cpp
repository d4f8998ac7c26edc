// The gRPC link on its own: the sending link (GrpcTransportFactory) of stage 0
// and the receiving StageDataService of stage 1, its Inbox behind a loopback
// server on port 0, both in this process. Frames arrive in the order sent and
// byte for byte, bad frames are refused naming what was wrong, a receiver that
// goes away fails the sender (no hang), and Shutdown is idempotent.
//
// The tests wait on the inbox (condition variables with deadlines) and on the
// link's status. The link reports a broken stream only when it next writes,
// and has no call that waits for that (see WaitUntilBroken), so those waits
// probe with tiny frames until a deadline; none sleeps.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "common/server.h"
#include "transport/grpc/chunk_codec.h"
#include "transport/grpc/grpc_transport.h"
#include "transport/grpc/stage_data_service.h"
#include "transport/inbox.h"
#include "transport/tensor_codec.h"
#include "transport/tensor_payload.h"
#include "common/files.h"

namespace conveyor {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

constexpr std::chrono::seconds kWait{30};  // a generous bound on what should take milliseconds

// Stage 1 of 2: an Inbox behind the real StageData service on 127.0.0.1:0.
class Receiver {
 public:
  Receiver() : service_(&inbox, "cpu") {
    auto server = GrpcServer::Start("127.0.0.1:0", {&service_});
    EXPECT_TRUE(server.ok()) << server.status();
    if (server.ok()) server_ = std::move(*server);
  }
  bool ok() const { return server_ != nullptr; }
  const std::string& address() const { return server_->address(); }
  // The receiver goes away: calls in flight end at once.
  void Stop() { server_->Shutdown(0); }

  // Expects activations of `sample` per row (at most 2 rows, 4 micro-batches)
  // and gradients of the same shape into chunk 1, in step 0 of `job`.
  void Open(const std::string& job, v1::DType dtype, std::vector<int64_t> sample) {
    InboxExpectations e;
    e.job_id = job;
    e.stage_index = 1;
    e.num_stages = 2;
    e.dtype = dtype;
    e.activation_shapes[1] = sample;
    e.gradient_shapes[1] = sample;
    e.max_micro_batches = 4;
    e.max_micro_batch_size = 2;
    inbox.Open(e);
    inbox.BeginStep(v1::PHASE_TRAIN, 0);
  }

  Inbox inbox;

 private:
  StageDataService service_;
  std::unique_ptr<GrpcServer> server_;  // declared last: stops before the service and inbox go
};

// Stage 0's link to the stage at `downstream`.
StatusOr<std::unique_ptr<Transport>> Connect(const std::string& downstream,
                                             std::chrono::duration<double> timeout = std::chrono::seconds(5)) {
  v1::StageAssignment a;
  a.set_job_id("job-1");
  a.set_stage_index(0);
  a.set_num_stages(2);
  a.set_downstream(downstream);
  LinkOptions options;
  options.device = "cpu";
  options.timeout = timeout;
  GrpcTransportFactory factory;
  return factory.Connect(a, options, Clock::now() + kWait);
}

v1::TensorFrame Header(const std::string& job, v1::FrameKind kind, int mb, const at::Tensor& t) {
  v1::TensorFrame h;
  h.set_job_id(job);
  h.set_phase(v1::PHASE_TRAIN);
  h.set_step(0);
  h.set_micro_batch(mb);
  h.set_kind(kind);
  h.set_chunk(1);
  auto dtype = ToWireDType(t.scalar_type());
  EXPECT_TRUE(dtype.ok()) << dtype.status();
  h.mutable_tensor()->set_dtype(dtype.ok() ? *dtype : v1::DTYPE_UNSPECIFIED);
  for (int64_t d : t.sizes()) h.mutable_tensor()->add_shape(d);
  return h;
}

// An activation frame carrying `t` inline, as a stage sends it.
Frame Activation(const std::string& job, int mb, const at::Tensor& t) {
  Frame f;
  f.header = Header(job, v1::FRAME_ACTIVATION, mb, t);
  f.payload = MakeTensorPayload(t);
  return f;
}

// A header whose bytes travel apart (NCCL): it crosses the stream alone and
// the inbox hands it to the fetcher of its kind.
Frame ApartHeader(const std::string& job, v1::FrameKind kind, int mb, const at::Tensor& shape_of) {
  Frame f;
  f.header = Header(job, kind, mb, shape_of);
  f.header.set_carrier(v1::CARRIER_NCCL);
  return f;
}

// Random contents of every bit pattern a dtype may carry.
at::Tensor Random(at::ScalarType dtype, at::IntArrayRef shape) {
  if (at::isFloatingType(dtype)) return at::randn(shape, at::kDouble).mul_(1000).to(dtype);
  return at::randint(std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max(), shape,
                     at::TensorOptions().dtype(dtype));
}

bool SameBytes(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor ca = a.contiguous(), cb = b.contiguous();
  return ca.scalar_type() == cb.scalar_type() && ca.sizes() == cb.sizes() &&
         std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()) == 0;
}

// Sends tiny probe frames until the link reports itself broken (a gRPC link
// learns of a broken stream only when it writes) or `deadline` passes; the
// link's error, or OK if it never broke.
Status WaitUntilBroken(Transport& t, Clock::time_point deadline) {
  const at::Tensor probe = at::zeros({1, 1});
  while (Clock::now() < deadline) {
    Status st = t.Send(Peer::kDownstream, ApartHeader("probe", v1::FRAME_GRADIENT, 0, probe));
    if (st.ok()) st = t.status();
    if (!st.ok()) return st;
    std::this_thread::yield();
  }
  return absl::OkStatus();
}

// Records the headers the inbox hands over, in order, and lets a test wait for them.
class RecordingFetcher final : public PayloadFetcher {
 public:
  Status Fetch(v1::TensorFrame header) override {  // under the inbox's lock: only record
    {
      std::lock_guard<std::mutex> lock(mu_);
      seen_.emplace_back(header.kind(), header.micro_batch());
    }
    cv_.notify_all();
    return absl::OkStatus();
  }
  // The headers seen once there are `n`, or those seen by `deadline`.
  std::vector<std::pair<v1::FrameKind, int>> WaitFor(std::size_t n, Clock::time_point deadline) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_until(lock, deadline, [&] { return seen_.size() >= n; });
    return seen_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::pair<v1::FrameKind, int>> seen_;
};

TEST(GrpcLink, TensorsOfEveryDtypeArriveByteForByte) {
  Receiver receiver;
  ASSERT_TRUE(receiver.ok());
  auto link = Connect(receiver.address());
  ASSERT_TRUE(link.ok()) << link.status();
  EXPECT_EQ((*link)->Kind(Peer::kDownstream), v1::LINK_GRPC);
  const std::vector<int64_t> sample = {3, 5};
  for (at::ScalarType dtype : {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf, at::kLong, at::kInt}) {
    SCOPED_TRACE(c10::toString(dtype));
    const std::string job = std::string("job-") + c10::toString(dtype);
    receiver.Open(job, *ToWireDType(dtype), sample);
    // Full and partial micro-batches (2 rows, then 1, as an uneven split makes).
    std::vector<at::Tensor> sent;
    for (int mb = 0; mb < 4; ++mb) {
      sent.push_back(Random(dtype, {mb % 2 == 0 ? 2 : 1, 3, 5}));
      ASSERT_TRUE((*link)->Send(Peer::kDownstream, Activation(job, mb, sent.back())).ok());
    }
    for (int mb = 0; mb < 4; ++mb) {
      auto got = receiver.inbox.Take(v1::FRAME_ACTIVATION, 1, mb, Clock::now() + kWait);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(got->header.micro_batch(), mb);
      EXPECT_TRUE(SameBytes(TakeTensor(*got, at::kCPU), sent[mb])) << "micro-batch " << mb;
    }
    EXPECT_EQ(receiver.inbox.held(), 0u);
  }
  EXPECT_TRUE((*link)->status().ok()) << (*link)->status();
}

// 2 x 1,310,721 floats: 10 MiB and 8 bytes, two whole chunks and a short one.
TEST(GrpcLink, ALargeTensorCrossesInChunksAndReassembles) {
  Receiver receiver;
  ASSERT_TRUE(receiver.ok());
  auto link = Connect(receiver.address());
  ASSERT_TRUE(link.ok()) << link.status();
  const int64_t row = (int64_t{5} << 20) / 4 + 1;
  receiver.Open("job-big", v1::DTYPE_FLOAT32, {row});
  const at::Tensor big = at::randn({2, row});
  ASSERT_GT(big.nbytes(), 2 * static_cast<std::size_t>(kChunkBytes));
  ASSERT_NE(big.nbytes() % kChunkBytes, 0u);
  const at::Tensor small = at::randn({1, row});
  ASSERT_TRUE((*link)->Send(Peer::kDownstream, Activation("job-big", 0, big)).ok());
  ASSERT_TRUE((*link)->Send(Peer::kDownstream, Activation("job-big", 1, small)).ok());
  auto got = receiver.inbox.Take(v1::FRAME_ACTIVATION, 1, 0, Clock::now() + kWait);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(SameBytes(TakeTensor(*got, at::kCPU), big));
  got = receiver.inbox.Take(v1::FRAME_ACTIVATION, 1, 1, Clock::now() + kWait);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(SameBytes(TakeTensor(*got, at::kCPU), small));
}

// The inbox keys frames by micro-batch, so the order shows where it is kept:
// in the fetchers' calls (headers whose bytes travel apart go to them in
// stream order), and in which of two frames for one slot arrives first.
TEST(GrpcLink, FramesArriveInTheOrderSent) {
  Receiver receiver;
  ASSERT_TRUE(receiver.ok());
  auto link = Connect(receiver.address());
  ASSERT_TRUE(link.ok()) << link.status();
  receiver.Open("job-order", v1::DTYPE_FLOAT32, {7});
  RecordingFetcher fetcher;
  receiver.inbox.SetFetcher(Peer::kUpstream, &fetcher);
  receiver.inbox.SetFetcher(Peer::kDownstream, &fetcher);
  const at::Tensor shape = at::zeros({2, 7});
  // An order that no sorting by kind or micro-batch reproduces.
  const std::vector<std::pair<v1::FrameKind, int>> order = {
      {v1::FRAME_GRADIENT, 3}, {v1::FRAME_ACTIVATION, 0}, {v1::FRAME_ACTIVATION, 2}, {v1::FRAME_GRADIENT, 0},
      {v1::FRAME_ACTIVATION, 1}, {v1::FRAME_GRADIENT, 2}, {v1::FRAME_ACTIVATION, 3}, {v1::FRAME_GRADIENT, 1}};
  for (const auto& [kind, mb] : order)
    ASSERT_TRUE((*link)->Send(Peer::kDownstream, ApartHeader("job-order", kind, mb, shape)).ok());
  EXPECT_EQ(fetcher.WaitFor(order.size(), Clock::now() + kWait), order);
  receiver.inbox.SetFetcher(Peer::kUpstream, nullptr);
  receiver.inbox.SetFetcher(Peer::kDownstream, nullptr);

  // Inline frames: a 3-chunk frame, then a small one for the same slot. The
  // first sent is held; the second is a duplicate, refused, and ends the stream.
  const int64_t row = (int64_t{5} << 20) / 4 + 1;
  receiver.Open("job-order", v1::DTYPE_FLOAT32, {row});
  const at::Tensor first = at::randn({2, row}), second = at::randn({1, row});
  ASSERT_TRUE((*link)->Send(Peer::kDownstream, Activation("job-order", 0, first)).ok());
  ASSERT_TRUE((*link)->Send(Peer::kDownstream, Activation("job-order", 0, second)).ok());
  Status broken = WaitUntilBroken(**link, Clock::now() + kWait);
  EXPECT_TRUE(absl::IsAlreadyExists(broken)) << broken;
  auto got = receiver.inbox.Take(v1::FRAME_ACTIVATION, 1, 0, Clock::now() + kWait);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(SameBytes(TakeTensor(*got, at::kCPU), first));
}

TEST(GrpcLink, AFrameOfTheWrongShapeOrDtypeIsRefusedNamingIt) {
  Receiver receiver;
  ASSERT_TRUE(receiver.ok());
  struct Case {
    at::Tensor tensor;
    const char* reason;
  };
  const Case cases[] = {
      {at::zeros({2, 4}), "step 0 micro-batch 0: activation has shape [2, 4], expected [2, 3]"},
      {at::zeros({2, 3}, at::kDouble), "step 0 micro-batch 0: activation has dtype float64, expected float32"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.reason);
    receiver.Open("job-bad", v1::DTYPE_FLOAT32, {3});
    auto link = Connect(receiver.address());  // a refusal ends the stream: a link per case
    ASSERT_TRUE(link.ok()) << link.status();
    ASSERT_TRUE((*link)->Send(Peer::kDownstream, Activation("job-bad", 0, c.tensor)).ok());
    // The sender learns why, with the link named.
    Status broken = WaitUntilBroken(**link, Clock::now() + kWait);
    EXPECT_TRUE(absl::IsInvalidArgument(broken)) << broken;
    EXPECT_THAT(std::string(broken.message()), HasSubstr(c.reason));
    EXPECT_THAT(std::string(broken.message()), HasSubstr("link to stage 1 at " + receiver.address()));
  }
  // The receiver still takes good frames on a new stream.
  receiver.Open("job-good", v1::DTYPE_FLOAT32, {3});
  auto link = Connect(receiver.address());
  ASSERT_TRUE(link.ok()) << link.status();
  const at::Tensor t = at::randn({2, 3});
  ASSERT_TRUE((*link)->Send(Peer::kDownstream, Activation("job-good", 0, t)).ok());
  auto got = receiver.inbox.Take(v1::FRAME_ACTIVATION, 1, 0, Clock::now() + kWait);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(SameBytes(TakeTensor(*got, at::kCPU), t));
}

// The inbox promises that a malformed tensor fails the step waiting for it
// (inbox.h), so the stage does not wait out its stage_timeout for a tensor
// that will never come; over the chunked stream the ChunkReceiver refuses the
// header with Inbox::CheckHeader, which does the same. (Before it did, the
// Take below waited its whole deadline and ended DEADLINE_EXCEEDED.)
TEST(GrpcLink, ARefusedHeaderFailsTheStepWaitingForIt) {
  Receiver receiver;
  ASSERT_TRUE(receiver.ok());
  receiver.Open("job-bad", v1::DTYPE_FLOAT32, {3});
  auto taker = std::async(std::launch::async, [&] {
    return receiver.inbox.Take(v1::FRAME_ACTIVATION, 1, 0, Clock::now() + kWait);
  });
  auto link = Connect(receiver.address());
  ASSERT_TRUE(link.ok()) << link.status();
  ASSERT_TRUE((*link)->Send(Peer::kDownstream, Activation("job-bad", 0, at::zeros({2, 4}))).ok());
  Status taken = taker.get().status();
  EXPECT_TRUE(absl::IsInvalidArgument(taken)) << taken;
  EXPECT_THAT(std::string(taken.message()), HasSubstr("activation has shape [2, 4], expected [2, 3]"));
}

TEST(GrpcLink, AReceiverThatGoesAwayFailsTheSenderWithinTheTimeout) {
  Receiver receiver;
  ASSERT_TRUE(receiver.ok());
  const auto timeout = std::chrono::seconds(3);
  auto link = Connect(receiver.address(), timeout);
  ASSERT_TRUE(link.ok()) << link.status();
  receiver.Open("job-1", v1::DTYPE_FLOAT32, {3});
  ASSERT_TRUE((*link)->Send(Peer::kDownstream, Activation("job-1", 0, at::randn({2, 3}))).ok());
  ASSERT_TRUE(receiver.inbox.Take(v1::FRAME_ACTIVATION, 1, 0, Clock::now() + kWait).ok());  // the stream is up

  const std::string address = receiver.address();
  receiver.Stop();
  const auto start = Clock::now();
  Status broken = WaitUntilBroken(**link, start + timeout);
  EXPECT_THAT(broken.code(), AnyOf(absl::StatusCode::kUnavailable, absl::StatusCode::kDeadlineExceeded)) << broken;
  EXPECT_THAT(std::string(broken.message()), HasSubstr("link to stage 1 at " + address));
  // Every later send says so too, and Shutdown does not wait for the peer.
  Status again = (*link)->Send(Peer::kDownstream, Activation("job-1", 1, at::randn({2, 3})));
  EXPECT_EQ(again.code(), broken.code()) << again;
  auto shut = std::async(std::launch::async, [&] { (*link)->Shutdown(); });
  EXPECT_EQ(shut.wait_for(kWait), std::future_status::ready);

  // A link to where nobody listens any more fails by its deadline, naming the address.
  v1::StageAssignment a;
  a.set_job_id("job-1");
  a.set_stage_index(0);
  a.set_num_stages(2);
  a.set_downstream(address);
  LinkOptions options;
  options.device = "cpu";
  GrpcTransportFactory factory;
  const auto connect_start = Clock::now();
  auto gone = factory.Connect(a, options, connect_start + timeout);
  EXPECT_LT(Clock::now() - connect_start, timeout + std::chrono::seconds(1));
  ASSERT_FALSE(gone.ok());
  EXPECT_THAT(gone.status().code(), AnyOf(absl::StatusCode::kUnavailable, absl::StatusCode::kDeadlineExceeded))
      << gone.status();
  EXPECT_THAT(std::string(gone.status().message()), HasSubstr(address));
}

// The names of this process's threads (Linux: /proc/self/task/*/comm).
std::vector<std::string> ThreadNames() {
  std::vector<std::string> names;
  for (const std::string& task : ListDir("/proc/self/task")) {
    std::ifstream comm("/proc/self/task/" + task + "/comm");
    std::string name;
    if (std::getline(comm, name)) names.push_back(name);
  }
  return names;
}

// The receiving service is served by gRPC's synchronous server. A callback
// method would make gRPC start its callback queue, whose two "nexting"
// threads sleep 100 ms after each second without an event; a connection
// given to that queue went unread meanwhile, and a stage server's step
// request waited 100 ms about once a second (stage_data_service.h).
TEST(GrpcLink, TheReceivingServerStartsNoThreadsOfGrpcsCallbackQueue) {
  if (!std::filesystem::exists("/proc/self/task")) GTEST_SKIP() << "no /proc/self/task to read thread names from";
  Receiver receiver;
  ASSERT_TRUE(receiver.ok());
  auto link = Connect(receiver.address());
  ASSERT_TRUE(link.ok()) << link.status();
  receiver.Open("job-threads", v1::DTYPE_FLOAT32, {3});
  const at::Tensor sent = at::randn({2, 3});
  ASSERT_TRUE((*link)->Send(Peer::kDownstream, Activation("job-threads", 0, sent)).ok());
  auto got = receiver.inbox.Take(v1::FRAME_ACTIVATION, 1, 0, Clock::now() + kWait);
  ASSERT_TRUE(got.ok()) << got.status();  // the stream is being served now
  const std::vector<std::string> names = ThreadNames();
  ASSERT_FALSE(names.empty());
  EXPECT_THAT(names, ::testing::Not(::testing::Contains(std::string("nexting_thread"))));
}

TEST(GrpcLink, ShutdownIsIdempotent) {
  Receiver receiver;
  ASSERT_TRUE(receiver.ok());
  auto link = Connect(receiver.address());
  ASSERT_TRUE(link.ok()) << link.status();
  receiver.Open("job-1", v1::DTYPE_FLOAT32, {3});
  ASSERT_TRUE((*link)->Send(Peer::kDownstream, Activation("job-1", 0, at::randn({2, 3}))).ok());
  ASSERT_TRUE(receiver.inbox.Take(v1::FRAME_ACTIVATION, 1, 0, Clock::now() + kWait).ok());
  (*link)->Shutdown();
  (*link)->Shutdown();
  Status after = (*link)->Send(Peer::kDownstream, Activation("job-1", 1, at::randn({2, 3})));
  EXPECT_TRUE(absl::IsCancelled(after)) << after;
  EXPECT_THAT(std::string(after.message()), HasSubstr("link to stage 1 is closed"));
  // No neighbour on the other side: refused, not dropped silently.
  EXPECT_TRUE(absl::IsFailedPrecondition((*link)->Send(Peer::kUpstream, Activation("job-1", 1, at::randn({2, 3})))));
  link->reset();  // the destructor shuts down once more
  receiver.Stop();
  receiver.Stop();
}

}  // namespace
}  // namespace conveyor
