#include "bench/load/load_modes.h"

#include <atomic>
#include <chrono>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "bench/load/load_stats.h"
#include "common/net.h"
#include "common/status.h"
#include "conveyor.grpc.pb.h"

namespace conveyor::bench {
namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The ids acknowledged so far, shared by the submitters and their readers.
class Ids {
 public:
  explicit Ids(const std::string& out_path) {
    if (!out_path.empty()) out_.open(out_path, std::ios::app);
  }
  void Add(const std::string& id) {
    std::lock_guard<std::mutex> lock(mu_);
    ids_.push_back(id);
    if (out_.is_open()) out_ << id << std::endl;  // flushed: a coordinator killed now has acknowledged it
  }
  // A random one; empty when there is none yet.
  std::string Pick(std::mt19937& rng) {
    std::lock_guard<std::mutex> lock(mu_);
    if (ids_.empty()) return "";
    return ids_[std::uniform_int_distribution<std::size_t>(0, ids_.size() - 1)(rng)];
  }

 private:
  std::mutex mu_;
  std::vector<std::string> ids_;
  std::ofstream out_;
};

struct Shared {
  Shared(const LoadOptions& options, std::string job_yaml)
      : o(options), channel(MakeChannel(options.coordinator, std::nullopt)), yaml(std::move(job_yaml)),
        ids(options.ids_out) {}
  const LoadOptions& o;
  std::shared_ptr<grpc::Channel> channel;
  std::string yaml;
  Clock::time_point end;
  LoadStats stats;
  Ids ids;
  std::atomic<int64_t> watch_updates{0};
};

void Submitter(Shared* s, int count) {
  auto stub = v1::Coordinator::NewStub(s->channel);
  v1::SubmitJobRequest req;
  req.set_job_yaml(s->yaml);
  for (int i = 0; i < count && Clock::now() < s->end; ++i) {
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineAfter(30));
    v1::SubmitJobReply reply;
    const auto t = Clock::now();
    grpc::Status st = stub->SubmitJob(&ctx, req, &reply);
    s->stats.Add("SubmitJob", Since(t), st);
    if (st.ok()) s->ids.Add(reply.job_id());
    if (!st.ok()) std::this_thread::sleep_for(std::chrono::milliseconds(50));  // as a client would back off
  }
}

// Follows one job after another until the end: the first status's latency
// counts as "WatchJob (first)", the whole stream as "WatchJob (to its end)".
void Watcher(Shared* s, unsigned seed) {
  auto stub = v1::Coordinator::NewStub(s->channel);
  std::mt19937 rng(seed);
  while (Clock::now() < s->end) {
    std::string id = s->ids.Pick(rng);
    if (id.empty()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // nothing submitted yet
      continue;
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::duration_cast<std::chrono::system_clock::duration>(s->end - Clock::now()));
    v1::GetJobRequest req;
    req.set_job_id(id);
    req.set_omit_losses(true);
    const auto t = Clock::now();
    auto reader = stub->WatchJob(&ctx, req);
    v1::JobStatus status;
    bool first = true;
    while (reader->Read(&status)) {
      if (first) s->stats.Add("WatchJob (first)", Since(t), grpc::Status::OK);
      first = false;
      ++s->watch_updates;
    }
    grpc::Status st = reader->Finish();
    // The bench's own deadline ends the last watch of each watcher (set on the
    // system clock, it may fire a little before the steady clock's end).
    if (st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED && Clock::now() >= s->end - std::chrono::seconds(1))
      break;
    s->stats.Add("WatchJob (to its end)", Since(t), st);
    if (!st.ok()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// `calls` GetJob and ListJobs calls a second from this thread, at even times.
void Poller(Shared* s, double calls, unsigned seed) {
  auto stub = v1::Coordinator::NewStub(s->channel);
  std::mt19937 rng(seed);
  const auto every = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(1.0 / calls));
  auto next = Clock::now();
  for (int64_t n = 0; next < s->end; ++n, next += every) {
    std::this_thread::sleep_until(next);
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineAfter(30));
    const auto t = Clock::now();
    if (n % 2 == 0) {
      std::string id = s->ids.Pick(rng);
      if (id.empty()) continue;
      v1::GetJobRequest req;
      req.set_job_id(id);
      req.set_omit_losses(true);
      v1::JobStatus reply;
      grpc::Status st = stub->GetJob(&ctx, req, &reply);
      s->stats.Add("GetJob", Since(t), st);
    } else {
      v1::ListJobsReply reply;
      grpc::Status st = stub->ListJobs(&ctx, v1::ListJobsRequest(), &reply);
      s->stats.Add("ListJobs", Since(t), st);
    }
  }
}

StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError("cannot read " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

int RunLoad(const LoadOptions& o) {
  auto yaml = ReadFile(o.job_file);
  if (!yaml.ok()) {
    std::cerr << "load_bench: " << yaml.status().message() << "\n";
    return 2;
  }
  Shared s(o, *yaml);
  const auto start = Clock::now();
  s.end = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.seconds));
  std::vector<std::thread> threads;
  for (int c = 0; c < o.clients; ++c)
    threads.emplace_back(Submitter, &s, o.jobs / o.clients + (c < o.jobs % o.clients ? 1 : 0));
  for (int w = 0; w < o.watchers; ++w) threads.emplace_back(Watcher, &s, 1000u + static_cast<unsigned>(w));
  const int pollers = 16;
  for (int p = 0; p < pollers; ++p) threads.emplace_back(Poller, &s, o.rate / pollers, 2000u + static_cast<unsigned>(p));
  for (auto& t : threads) t.join();
  const double took = Since(start);
  std::cout << "load: " << s.stats.Calls("SubmitJob") << " submissions by " << o.clients << " clients, " << o.watchers
            << " watchers (" << s.watch_updates << " statuses streamed), GetJob and ListJobs at " << o.rate
            << "/s; " << took << " s\n";
  s.stats.Print(std::cout);
  std::set<grpc::StatusCode> allowed;
  for (int c = 0; c < 17; ++c) {
    for (const std::string& name : o.allow)
      if (CodeName(static_cast<grpc::StatusCode>(c)) == name) allowed.insert(static_cast<grpc::StatusCode>(c));
  }
  auto bad = s.stats.Unexpected(allowed);
  for (const std::string& b : bad) std::cout << "unexpected error: " << b << "\n";
  return bad.empty() ? 0 : 1;
}

int RunCheck(const std::string& coordinator, const std::string& ids_file) {
  auto text = ReadFile(ids_file);
  if (!text.ok()) {
    std::cerr << "load_bench: " << text.status().message() << "\n";
    return 2;
  }
  auto stub = v1::Coordinator::NewStub(MakeChannel(coordinator, std::nullopt));
  grpc::ClientContext ctx;
  ctx.set_wait_for_ready(true);
  ctx.set_deadline(DeadlineAfter(60));
  v1::ListJobsReply reply;
  grpc::Status st = stub->ListJobs(&ctx, v1::ListJobsRequest(), &reply);
  if (!st.ok()) {
    std::cout << "check: ListJobs failed: " << CodeName(st.error_code()) << " " << st.error_message() << "\n";
    return 1;
  }
  std::map<std::string, v1::JobState> listed;
  std::map<std::string, int> by_state;
  int bad = 0;
  for (const v1::JobStatus& j : reply.jobs()) {
    if (!listed.emplace(j.job_id(), j.state()).second) {
      std::cout << "check: " << j.job_id() << " is listed twice\n";
      ++bad;
    }
    const bool valid = j.state() >= v1::JOB_STATE_QUEUED && j.state() <= v1::JOB_STATE_RECOVERING;
    if (!valid) {
      std::cout << "check: " << j.job_id() << " has no valid state (" << j.state() << ")\n";
      ++bad;
    }
    ++by_state[v1::JobState_Name(j.state())];
  }
  std::istringstream in(*text);
  int acknowledged = 0;
  for (std::string id; std::getline(in, id);) {
    if (id.empty()) continue;
    ++acknowledged;
    if (!listed.count(id)) {
      std::cout << "check: " << id << " was acknowledged but is not in the database\n";
      ++bad;
    }
  }
  std::cout << "check: " << acknowledged << " jobs acknowledged, " << reply.jobs_size() << " listed:";
  for (const auto& [state, n] : by_state) std::cout << " " << state << " " << n;
  std::cout << "; " << bad << " problems\n";
  return bad == 0 ? 0 : 1;
}

}  // namespace conveyor::bench
