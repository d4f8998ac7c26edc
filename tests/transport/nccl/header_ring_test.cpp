#include "transport/nccl/header_ring.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

namespace conveyor {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;
using std::chrono::microseconds;

std::string FreshName() {
  static std::atomic<int> n{0};
  return LinkRings::NameFor("test-" + std::to_string(getpid()) + "-" + std::to_string(n++));
}

std::string Header(int i) { return "header " + std::to_string(i) + std::string(static_cast<size_t>(i % 97), 'x'); }

TEST(HeaderRing, HeadersCrossProcessesInOrderThroughAFullRing) {
  const std::string name = FreshName();
  auto created = LinkRings::Create(name);
  ASSERT_TRUE(created.ok()) << created.status();
  constexpr int kHeaders = 1000;  // many times the ring's slots: it fills and wraps
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // the downstream stage: attaches, then sends gradients' headers
    auto rings = LinkRings::Attach(name);
    if (!rings.ok()) _exit(2);
    for (int i = 0; i < kHeaders; ++i) {
      if (!(*rings)->gradients().Push(Header(i), Clock::now() + std::chrono::seconds(60)).ok()) _exit(3);
    }
    // Waits until the parent read them all before the segment goes.
    auto done = (*rings)->activations().Pop(std::chrono::seconds(60));
    _exit(done.ok() && *done && **done == "done" ? 0 : 4);
  }
  LinkRings& rings = **created;
  for (int i = 0; i < kHeaders; ++i) {
    auto got = rings.gradients().Pop(std::chrono::seconds(60));
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_TRUE(got->has_value()) << "header " << i << " never came";
    ASSERT_EQ(**got, Header(i));
  }
  EXPECT_TRUE(rings.attached());
  ASSERT_TRUE(rings.activations().Push("done", Clock::now() + std::chrono::seconds(60)).ok());
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(HeaderRing, AttachingFindsNothingWhereNoStageMadeTheSegment) {
  auto rings = LinkRings::Attach(FreshName());
  EXPECT_TRUE(absl::IsNotFound(rings.status())) << rings.status();
}

TEST(HeaderRing, AttachingUnlinksTheNameAndMarksTheSegment) {
  const std::string name = FreshName();
  auto up = LinkRings::Create(name);
  ASSERT_TRUE(up.ok()) << up.status();
  EXPECT_FALSE((*up)->attached());
  auto down = LinkRings::Attach(name);
  ASSERT_TRUE(down.ok()) << down.status();
  EXPECT_TRUE((*up)->attached());
  EXPECT_TRUE(absl::IsNotFound(LinkRings::Attach(name).status()));  // nothing left to leak
}

TEST(HeaderRing, ASegmentOfAnotherLayoutIsRefused) {
  const std::string name = FreshName();
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 10), 0);
  close(fd);
  auto rings = LinkRings::Attach(name);
  shm_unlink(name.c_str());
  EXPECT_TRUE(absl::IsFailedPrecondition(rings.status())) << rings.status();
  EXPECT_THAT(std::string(rings.status().message()), HasSubstr("not a Conveyor header ring"));
}

TEST(HeaderRing, OversizedHeadersAreRefused) {
  auto rings = LinkRings::Create(FreshName());
  ASSERT_TRUE(rings.ok()) << rings.status();
  Status st = (*rings)->activations().Push(std::string(HeaderRing::kMaxBytes + 1, 'h'), Clock::now());
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("does not fit"));
}

TEST(HeaderRing, AnEmptyRingEndsTheWaitWithNothing) {
  auto rings = LinkRings::Create(FreshName());
  ASSERT_TRUE(rings.ok()) << rings.status();
  auto got = (*rings)->activations().Pop(microseconds(500));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_FALSE(got->has_value());
}

TEST(HeaderRing, AProducerAheadOfItsConsumerGivesUpAtItsDeadline) {
  auto rings = LinkRings::Create(FreshName());
  ASSERT_TRUE(rings.ok()) << rings.status();
  HeaderRing& ring = (*rings)->activations();
  Status st;
  int pushed = 0;
  while (st.ok() && pushed < 10000) {
    st = ring.Push(Header(pushed), Clock::now() + std::chrono::milliseconds(1));
    if (st.ok()) ++pushed;
  }
  EXPECT_TRUE(absl::IsDeadlineExceeded(st)) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("took no frame header"));
  EXPECT_GT(pushed, 0);
  auto first = ring.Pop(microseconds(0));  // what was written is intact
  ASSERT_TRUE(first.ok() && first->has_value());
  EXPECT_EQ(**first, Header(0));
}

TEST(HeaderRing, ClosingWakesASleepingConsumerOfTheOtherProcessView) {
  const std::string name = FreshName();
  auto up = LinkRings::Create(name);
  ASSERT_TRUE(up.ok()) << up.status();
  auto down = LinkRings::Attach(name);  // a second mapping, as the peer has
  ASSERT_TRUE(down.ok()) << down.status();
  HeaderRing& consumer = (*down)->activations();
  consumer.SetSpin(microseconds(0));  // straight to the futex
  StatusOr<std::optional<std::string>> got = std::optional<std::string>();
  std::thread t([&] { got = consumer.Pop(std::chrono::seconds(120)); });
  (*up)->Close();  // the upstream stage goes away
  t.join();
  EXPECT_TRUE(absl::IsCancelled(got.status())) << got.status();
  EXPECT_TRUE(absl::IsCancelled((*up)->activations().Push("late", Clock::now() + std::chrono::seconds(1))));
}

TEST(HeaderRing, ASleepingConsumerWakesForAHeader) {
  const std::string name = FreshName();
  auto up = LinkRings::Create(name);
  ASSERT_TRUE(up.ok()) << up.status();
  auto down = LinkRings::Attach(name);
  ASSERT_TRUE(down.ok()) << down.status();
  HeaderRing& consumer = (*down)->gradients();
  consumer.SetSpin(microseconds(0));
  StatusOr<std::optional<std::string>> got = std::optional<std::string>();
  std::thread t([&] { got = consumer.Pop(std::chrono::seconds(120)); });
  ASSERT_TRUE((*up)->gradients().Push("wake up", Clock::now() + std::chrono::seconds(1)).ok());
  t.join();
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ(**got, "wake up");
}

}  // namespace
}  // namespace conveyor
