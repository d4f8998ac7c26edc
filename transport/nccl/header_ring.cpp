#include "transport/nccl/header_ring.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>

#include "common/spin.h"

namespace conveyor {
namespace {

constexpr uint64_t kMagic = 0x434f4e5659485231ull;  // "CONVYHR1"
constexpr uint64_t kSlots = 64;

static_assert(std::atomic<uint64_t>::is_always_lock_free, "ring counters must be lock-free to be shared");
static_assert(std::atomic<uint32_t>::is_always_lock_free, "ring flags must be lock-free to be shared");

// Shared (not process-private) futexes: the two ends are two processes.
void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::microseconds timeout) {
  timespec ts;
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1000000);
  ts.tv_nsec = static_cast<long>((timeout.count() % 1000000) * 1000);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

}  // namespace

struct RingState {
  alignas(64) std::atomic<uint64_t> head{0};  // headers written (producer)
  alignas(64) std::atomic<uint64_t> tail{0};  // headers read (consumer)
  alignas(64) std::atomic<uint32_t> seq{0};   // bumped on every write and on close: the futex
  std::atomic<uint32_t> sleeping{0};          // the consumer sleeps, or is about to
  std::atomic<uint32_t> closed{0};
  struct Slot {
    uint32_t bytes;
    char data[HeaderRing::kMaxBytes];
  };
  Slot slots[kSlots];
};

struct RingSegment {
  uint64_t magic;
  std::atomic<uint32_t> attached;
  RingState activations;
  RingState gradients;
};

Status HeaderRing::Push(const std::string& bytes, Clock::time_point deadline) {
  if (static_cast<int64_t>(bytes.size()) > kMaxBytes) {
    return absl::InvalidArgumentError("a frame header of " + std::to_string(bytes.size()) +
                                      " bytes does not fit the shared-memory ring's " + std::to_string(kMaxBytes));
  }
  RingState& s = *state_;
  const uint64_t head = s.head.load(std::memory_order_relaxed);
  for (int spins = 0; head - s.tail.load(std::memory_order_acquire) >= kSlots; ++spins) {
    if (s.closed.load(std::memory_order_acquire)) return absl::CancelledError("the header ring is closed");
    if (Clock::now() > deadline) {
      return absl::DeadlineExceededError("the peer stage took no frame header for too long (the header ring is full)");
    }
    if (spins < 1000) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  if (s.closed.load(std::memory_order_acquire)) return absl::CancelledError("the header ring is closed");
  RingState::Slot& slot = s.slots[head % kSlots];
  slot.bytes = static_cast<uint32_t>(bytes.size());
  std::memcpy(slot.data, bytes.data(), bytes.size());
  // seq_cst: the consumer stores `sleeping` and then reads `head`; we store
  // `head` and then read `sleeping`. One of us sees the other's store.
  s.head.store(head + 1, std::memory_order_seq_cst);
  s.seq.fetch_add(1, std::memory_order_seq_cst);
  if (s.sleeping.load(std::memory_order_seq_cst)) FutexWakeAll(&s.seq);
  return absl::OkStatus();
}

StatusOr<std::optional<std::string>> HeaderRing::Pop(std::chrono::microseconds wait) {
  RingState& s = *state_;
  const uint64_t tail = s.tail.load(std::memory_order_relaxed);
  const auto start = Clock::now();
  const auto spin_until = start + std::min(spin_, wait);
  const auto until = start + wait;
  for (int i = 0;; ++i) {
    if (s.head.load(std::memory_order_acquire) > tail) break;
    if (s.closed.load(std::memory_order_acquire)) return absl::CancelledError("the header ring is closed");
    if ((i & 63) != 0) {
      CpuRelax();
      continue;
    }
    const auto now = Clock::now();
    if (now >= until) return std::optional<std::string>();
    if (now < spin_until) continue;
    const uint32_t seq = s.seq.load(std::memory_order_seq_cst);
    s.sleeping.store(1, std::memory_order_seq_cst);
    if (s.head.load(std::memory_order_seq_cst) == tail && !s.closed.load(std::memory_order_seq_cst)) {
      FutexWait(&s.seq, seq, std::chrono::duration_cast<std::chrono::microseconds>(until - now));
    }
    s.sleeping.store(0, std::memory_order_relaxed);
  }
  const RingState::Slot& slot = s.slots[tail % kSlots];
  const uint32_t n = std::min<uint32_t>(slot.bytes, static_cast<uint32_t>(kMaxBytes));
  std::string out(slot.data, n);
  s.tail.store(tail + 1, std::memory_order_release);
  return std::optional<std::string>(std::move(out));
}

void HeaderRing::Close() {
  RingState& s = *state_;
  s.closed.store(1, std::memory_order_seq_cst);
  s.seq.fetch_add(1, std::memory_order_seq_cst);
  FutexWakeAll(&s.seq);
}

std::string LinkRings::NameFor(const std::string& nccl_id) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : nccl_id) h = (h ^ c) * 1099511628211ull;
  char buf[40];
  std::snprintf(buf, sizeof buf, "/conveyor-link-%016llx", static_cast<unsigned long long>(h));
  return buf;
}

StatusOr<std::unique_ptr<LinkRings>> LinkRings::Create(const std::string& name) {
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return absl::UnavailableError(Errno("cannot create shared memory " + name));
  if (ftruncate(fd, sizeof(RingSegment)) != 0) {
    Status st = absl::UnavailableError(Errno("cannot size shared memory " + name));
    close(fd);
    shm_unlink(name.c_str());
    return st;
  }
  void* p = mmap(nullptr, sizeof(RingSegment), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    Status st = absl::UnavailableError(Errno("cannot map shared memory " + name));
    shm_unlink(name.c_str());
    return st;
  }
  auto* seg = new (p) RingSegment();  // zeroed by ftruncate; the atomics start at 0
  seg->magic = kMagic;
  return std::unique_ptr<LinkRings>(new LinkRings(name, seg, /*creator=*/true));
}

StatusOr<std::unique_ptr<LinkRings>> LinkRings::Attach(const std::string& name) {
  int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) {
    if (errno == ENOENT) return absl::NotFoundError("no shared memory " + name + " on this host");
    return absl::UnavailableError(Errno("cannot open shared memory " + name));
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_size != static_cast<off_t>(sizeof(RingSegment))) {
    close(fd);
    return absl::FailedPreconditionError("shared memory " + name + " is not a Conveyor header ring of this version");
  }
  void* p = mmap(nullptr, sizeof(RingSegment), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return absl::UnavailableError(Errno("cannot map shared memory " + name));
  auto* seg = static_cast<RingSegment*>(p);
  if (seg->magic != kMagic) {
    munmap(p, sizeof(RingSegment));
    return absl::FailedPreconditionError("shared memory " + name + " is not a Conveyor header ring of this version");
  }
  shm_unlink(name.c_str());  // both ends hold it now
  seg->attached.store(1, std::memory_order_seq_cst);
  auto rings = std::unique_ptr<LinkRings>(new LinkRings(name, seg, /*creator=*/false));
  return rings;
}

LinkRings::LinkRings(std::string name, RingSegment* segment, bool creator)
    : name_(std::move(name)), segment_(segment), unlinked_(!creator), activations_(&segment->activations),
      gradients_(&segment->gradients) {}

LinkRings::~LinkRings() {
  Close();
  if (!unlinked_) shm_unlink(name_.c_str());  // ENOENT once the peer did
  munmap(segment_, sizeof(RingSegment));
}

bool LinkRings::attached() const { return segment_->attached.load(std::memory_order_seq_cst) != 0; }

void LinkRings::Close() {
  activations_.Close();
  gradients_.Close();
}

}  // namespace conveyor
