// load_bench abuse: a stage server that runs a job, hit by many clients
// with what no Conveyor peer sends. Frames and calls name other jobs than
// the one it runs (a frame that names its job and is malformed fails that
// job's step on purpose, docs/architecture.md; strangers are kept out of a
// job by mutual TLS, docs/security.md).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <iostream>
#include <random>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "bench/load/load_modes.h"
#include "bench/load/load_stats.h"
#include "common/net.h"
#include "conveyor.grpc.pb.h"

namespace conveyor::bench {
namespace {

using Clock = std::chrono::steady_clock;

std::string RandomBytes(std::mt19937& rng, std::size_t n) {
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

// Random printable text: a proto `string` field must hold UTF-8, or the
// client's own library refuses to send it (INTERNAL, never reaching the server).
std::string RandomText(std::mt19937& rng, std::size_t n) {
  std::string s(n, ' ');
  for (char& c : s) c = static_cast<char>(' ' + rng() % 95);
  return s;
}

// Opens a TCP connection to HOST:PORT (numeric IPv4), writes `bytes`, reads
// until the server closes or 2 s pass. Returns whether the server closed it.
bool RawWrite(const std::string& address, const std::string& bytes) {
  const std::size_t colon = address.rfind(':');
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(std::stoi(address.substr(colon + 1))));
  inet_pton(AF_INET, address.substr(0, colon).c_str(), &a.sin_addr);
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  timeval tv{2, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  bool closed = false;
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    (void)!send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    char buf[4096];
    ssize_t n;
    while ((n = recv(fd, buf, sizeof buf, 0)) > 0) {
    }
    closed = n == 0 || (n < 0 && errno == ECONNRESET);
  }
  close(fd);
  return closed;
}

// A frame of a job the server does not run, its tensor's bytes not its shape's.
v1::TensorFrame StrangeFrame(std::mt19937& rng, int i) {
  v1::TensorFrame f;
  f.set_job_id(i % 3 == 0 ? "" : "job-abuse-" + std::to_string(rng() % 1000));
  f.set_phase(static_cast<v1::Phase>(rng() % 4));
  f.set_step(static_cast<int64_t>(rng()) - (1 << 30));
  f.set_micro_batch(static_cast<int32_t>(rng() % 100000));
  f.set_kind(static_cast<v1::FrameKind>(rng() % 3));
  f.set_chunk(static_cast<int32_t>(rng()));
  v1::Tensor* t = f.mutable_tensor();
  t->set_dtype(static_cast<v1::DType>(rng() % 12));
  for (int d = 0; d < 1 + static_cast<int>(rng() % 6); ++d) t->add_shape(static_cast<int64_t>(rng()) * 977);
  t->set_data(RandomBytes(rng, rng() % 65536));
  return f;
}

void PushGarbage(v1::StageData::Stub& stub, std::mt19937& rng, LoadStats* stats) {
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineAfter(10));
  v1::PushReply reply;
  const auto t = Clock::now();
  auto writer = stub.Push(&ctx, &reply);
  for (int i = 0; i < 8 && writer->Write(StrangeFrame(rng, i)); ++i) {
  }
  writer->WritesDone();
  stats->Add("StageData/Push (malformed)", std::chrono::duration<double>(Clock::now() - t).count(),
             writer->Finish());
}

// Calls of StageControl with what no coordinator sends: a job spec of
// `big` bytes that is no job, steps of jobs it does not run.
void ControlGarbage(v1::StageControl::Stub& stub, std::mt19937& rng, std::size_t big, LoadStats* stats) {
  auto timed = [&](const char* name, auto call) {
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineAfter(30));
    const auto t = Clock::now();
    grpc::Status st = call(&ctx);
    stats->Add(name, std::chrono::duration<double>(Clock::now() - t).count(), st);
  };
  timed("StageControl/Configure (big)", [&](grpc::ClientContext* ctx) {
    v1::StageAssignment a;
    a.set_job_id("job-abuse");
    a.mutable_spec()->set_name(RandomText(rng, big));
    v1::ConfigureReply r;
    return stub.Configure(ctx, a, &r);
  });
  timed("StageControl/RunStep (stranger)", [&](grpc::ClientContext* ctx) {
    v1::RunStepRequest req;
    req.set_job_id("job-abuse-" + std::to_string(rng() % 1000));
    req.set_step(static_cast<int64_t>(rng()));
    req.set_batch_size(-static_cast<int64_t>(rng() % 100));
    v1::RunStepReply r;
    return stub.RunStep(ctx, req, &r);
  });
  timed("StageControl/Release (stranger)", [&](grpc::ClientContext* ctx) {
    v1::JobRef ref;
    ref.set_job_id("job-abuse-" + std::to_string(rng() % 1000));
    v1::Empty r;
    return stub.Release(ctx, ref, &r);
  });
}

// One message over the server's limit (kMaxMessageBytes): refused, the
// server unharmed.
void Oversized(v1::StageControl::Stub& stub, LoadStats* stats) {
  v1::StageAssignment a;
  a.set_job_id("job-abuse");
  a.mutable_spec()->mutable_name()->assign(static_cast<std::size_t>(kMaxMessageBytes) + 1024, 'x');
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineAfter(60));
  v1::ConfigureReply r;
  const auto t = Clock::now();
  grpc::Status st = stub.Configure(&ctx, a, &r);
  stats->Add("StageControl/Configure (over 1 GiB)", std::chrono::duration<double>(Clock::now() - t).count(), st);
}

bool Answers(v1::StageControl::Stub& stub, std::string* job) {
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineAfter(10));
  v1::StageInfo info;
  grpc::Status st = stub.GetInfo(&ctx, v1::Empty(), &info);
  *job = info.job_id();
  return st.ok();
}

}  // namespace

int RunAbuse(const AbuseOptions& o) {
  auto channel = MakeChannel(o.stage, std::nullopt);
  auto control = v1::StageControl::NewStub(channel);
  std::string job;
  if (!Answers(*control, &job)) {
    std::cout << "abuse: " << o.stage << " does not answer\n";
    return 1;
  }
  std::cout << "abuse: " << o.stage << " runs '" << job << "'; " << o.clients << " clients for " << o.seconds << " s\n";
  LoadStats stats;
  std::atomic<int64_t> raw{0}, raw_closed{0};
  Oversized(*control, &stats);
  const auto end = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.seconds));
  std::vector<std::thread> threads;
  for (int c = 0; c < o.clients; ++c) {
    threads.emplace_back([&, c] {
      std::mt19937 rng(static_cast<unsigned>(c) + 7);
      // Each client its own connection, as separate hosts would have.
      grpc::ChannelArguments args;
      args.SetInt("grpc.channel_id", c);  // a channel of its own, not shared by the process
      auto ch = grpc::CreateCustomChannel(o.stage, grpc::InsecureChannelCredentials(), args);
      auto data = v1::StageData::NewStub(ch);
      auto ctl = v1::StageControl::NewStub(ch);
      for (int round = 0; Clock::now() < end; ++round) {
        // Not HTTP/2, then HTTP/2's preface followed by nonsense frames.
        const std::string preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
        const bool closed = RawWrite(o.stage, (round % 2 ? preface : "") + RandomBytes(rng, 1 + rng() % 65536));
        ++raw;
        if (closed) ++raw_closed;
        PushGarbage(*data, rng, &stats);
        ControlGarbage(*ctl, rng, round % 8 == 0 ? (16u << 20) : 4096, &stats);
      }
    });
  }
  for (auto& t : threads) t.join();
  std::cout << "abuse: " << raw << " connections of garbage bytes, " << raw_closed
            << " closed by the server\n";
  stats.Print(std::cout);
  std::string after;
  if (!Answers(*control, &after)) {
    std::cout << "abuse: the stage server no longer answers\n";
    return 1;
  }
  std::cout << "abuse: the stage server answers and runs '" << after << "'\n";
  // Only refusals are right: a call that succeeded was taken for a peer's.
  int taken = 0;
  for (const char* m : {"StageData/Push (malformed)", "StageControl/Configure (big)", "StageControl/RunStep (stranger)",
                        "StageControl/Configure (over 1 GiB)"}) {
    if (stats.Ok(m) > 0) std::cout << "abuse: " << m << " succeeded " << stats.Ok(m) << " times\n";
    taken += stats.Ok(m) > 0;
  }
  if (taken > 0) return 1;
  return 0;
}

}  // namespace conveyor::bench
