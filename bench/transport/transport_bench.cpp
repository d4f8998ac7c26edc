// transport_bench: GB/s and one-way latency per transport and tensor size,
// between two processes on loopback (fork; the sender is stage 0 on a GPU
// (--gpus, default cuda:0) or the CPU, the receiver stage 1 on another GPU
// (default cuda:1) or the CPU), through the stage
// server's own code: its StageData service and Inbox on the receiving side,
// its transports on the sending side. The baseline is a plain protobuf
// stream (StageData.Push, the tensor copied into a `bytes` field). `nccl`
// sends each frame's header through the link's shared memory (as stages on
// one host do), `nccl-grpc` on the gRPC stream (job key nccl_headers: grpc).
//
//   transport_bench [--sizes 1K,1M,16M] [--transports proto,grpc,nccl,nccl-grpc]
//                   [--device cpu|cuda] [--gpus 0,1] [--nccl-ctas N] [--rounds 5]
//                   [--csv out.csv]
//
// A round sends M frames of one size and ends when the receiver has taken
// the last one onto its device (it reports the time, CLOCK_MONOTONIC is
// shared by both processes): GB/s = M x size / time, median over rounds.
// Latency: rounds of one frame, from Send() to the receiver's Take().
#include <unistd.h>
#include <sys/wait.h>

#include <ATen/ATen.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>

#include "model/device.h"
#include "common/logging.h"
#include "common/net.h"
#include "common/server.h"
#include "transport/tensor_codec.h"
#include "conveyor.grpc.pb.h"
#include "transport/grpc/grpc_transport.h"
#include "transport/inbox.h"
#include "transport/nccl/nccl_channel.h"
#include "transport/grpc/stage_data_service.h"
#include "transport/tensor_payload.h"

namespace conveyor {
namespace {

using Clock = std::chrono::steady_clock;

// Commands from the sender to the receiver, fixed size over a pipe.
struct Command {
  enum Op : int32_t { kOpen, kNccl, kQuit } op;
  int64_t elems = 0;   // floats per frame
  int32_t frames = 0;  // per round
  int32_t rounds = 0;
  int32_t shm_headers = 0;  // kNccl
  char ids[2][128] = {};
};

void WriteAll(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t w = write(fd, c, n);
    if (w <= 0) std::_Exit(3);
    c += w;
    n -= static_cast<size_t>(w);
  }
}
void ReadAll(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    ssize_t r = read(fd, c, n);
    if (r <= 0) std::_Exit(4);
    c += r;
    n -= static_cast<size_t>(r);
  }
}
int64_t NowNs() { return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count(); }

void Check(const Status& st, const char* what) {
  if (!st.ok()) {
    std::cerr << what << ": " << st << std::endl;
    std::_Exit(2);
  }
}

v1::StageAssignment Assignment(int index, const std::string& neighbour) {
  v1::StageAssignment a;
  a.set_job_id("bench");
  a.set_stage_index(index);
  a.set_num_stages(2);
  a.set_num_chunks(2);
  if (index == 0) a.set_downstream(neighbour);
  if (index == 1) a.set_upstream(neighbour);
  return a;
}

// The receiving stage: serves StageData into its inbox, takes each round's
// frames onto its device and reports when the last one is there.
// --nccl-ctas, set before the fork: both processes read it.
int nccl_ctas = 0;

[[noreturn]] void Receiver(int cmd_fd, int ack_fd, const std::string& device) {
  Inbox inbox;
  if (device != "cpu") inbox.SetSpin(kGpuInboxSpin);  // as a GPU stage's
  StageDataService data(&inbox, device);
  auto server = GrpcServer::Start("127.0.0.1:0", {&data});
  Check(server.status(), "receiver server");
  int32_t port = (*server)->port();
  WriteAll(ack_fd, &port, sizeof port);
  int32_t sender_port = 0;
  ReadAll(cmd_fd, &sender_port, sizeof sender_port);
  GrpcTransportFactory factory;
  std::unique_ptr<Transport> transport;
  const at::Device dev(device);
  for (;;) {
    Command cmd;
    ReadAll(cmd_fd, &cmd, sizeof cmd);
    if (cmd.op == Command::kQuit) break;
    if (cmd.op == Command::kNccl) {
      if (transport) transport->Shutdown();  // before the new link's fetchers register with the inbox
      transport.reset();
      LinkOptions links;
      links.upstream.set_transport(v1::TRANSPORT_NCCL);
      links.upstream.set_activation_nccl_id(std::string(cmd.ids[0], 128));
      links.upstream.set_gradient_nccl_id(std::string(cmd.ids[1], 128));
      links.device = device;
      links.inbox = &inbox;
      links.timeout = std::chrono::seconds(60);
      links.nccl.ctas = nccl_ctas;
      links.nccl.shm_headers = cmd.shm_headers != 0;
      auto t = factory.Connect(Assignment(1, "127.0.0.1:" + std::to_string(sender_port)), links,
                               Clock::now() + std::chrono::seconds(30));
      Check(t.status(), "receiver NCCL link");
      transport = std::move(*t);
      int64_t ok = 0;
      WriteAll(ack_fd, &ok, sizeof ok);
      continue;
    }
    InboxExpectations e;
    e.job_id = "bench";
    e.stage_index = 1;
    e.num_stages = 2;
    e.activation_shapes[1] = {cmd.elems};
    e.max_micro_batches = cmd.frames;
    e.max_micro_batch_size = 1;
    inbox.Open(e);
    int64_t opened = 0;
    WriteAll(ack_fd, &opened, sizeof opened);
    for (int r = 0; r < cmd.rounds; ++r) {
      inbox.BeginStep(v1::PHASE_TRAIN, r);
      for (int mb = 0; mb < cmd.frames; ++mb) {
        auto f = inbox.Take(v1::FRAME_ACTIVATION, 1, mb, Clock::now() + std::chrono::seconds(120));
        Check(f.status(), "receiving");
        at::Tensor t = TakeTensor(*f, dev);
        if (t.is_cuda()) t.view(-1)[0].item<float>();  // on the device, complete
      }
      int64_t done = NowNs();
      WriteAll(ack_fd, &done, sizeof done);
    }
  }
  if (transport) transport->Shutdown();
  (*server)->Shutdown(0.5);
  std::fflush(nullptr);
  std::_Exit(0);
}

struct Row {
  std::string transport;
  int64_t bytes = 0;
  int frames = 0;
  double gbps = 0, latency_us = 0;
};

class Sender {
 public:
  Sender(int cmd_fd, int ack_fd, std::string device, int rounds)
      : cmd_fd_(cmd_fd), ack_fd_(ack_fd), device_(std::move(device)), rounds_(rounds) {
    auto server = GrpcServer::Start("127.0.0.1:0", {&data_});  // for the receiver's links back
    Check(server.status(), "sender server");
    server_ = std::move(*server);
    int32_t port = 0;
    ReadAll(ack_fd_, &port, sizeof port);
    receiver_ = "127.0.0.1:" + std::to_string(port);
    int32_t mine = server_->port();
    WriteAll(cmd_fd_, &mine, sizeof mine);
  }
  ~Sender() {
    Command quit{Command::kQuit};
    WriteAll(cmd_fd_, &quit, sizeof quit);
    if (transport_) transport_->Shutdown();
  }

  // Connects the sending side of `name`: "proto", "grpc" or "nccl".
  void Connect(const std::string& name) {
    if (transport_) transport_->Shutdown();
    transport_.reset();
    proto_writer_.reset();
    proto_ctx_.reset();
    name_ = name;
    if (name == "proto") {
      proto_stub_ = v1::StageData::NewStub(MakeChannel(receiver_));
      proto_ctx_ = std::make_unique<grpc::ClientContext>();
      proto_writer_ = proto_stub_->Push(proto_ctx_.get(), &proto_reply_);
      return;
    }
    LinkOptions links;
    links.device = device_;
    links.inbox = &inbox_;
    links.timeout = std::chrono::seconds(60);
    links.nccl.ctas = nccl_ctas;
    GrpcTransportFactory factory;
    if (name == "nccl" || name == "nccl-grpc") {
      Command cmd{Command::kNccl};
      cmd.shm_headers = name == "nccl";
      links.nccl.shm_headers = cmd.shm_headers != 0;
      // As the stage's PrepareLink: the ids, and the header rings before the peer hears of the link.
      auto setup = factory.PrepareLink(device_, links.nccl, &links.prepared);
      Check(setup.status(), "NCCL link");
      links.downstream = *setup;
      std::memcpy(cmd.ids[0], setup->activation_nccl_id().data(), std::min<size_t>(128, setup->activation_nccl_id().size()));
      std::memcpy(cmd.ids[1], setup->gradient_nccl_id().data(), std::min<size_t>(128, setup->gradient_nccl_id().size()));
      WriteAll(cmd_fd_, &cmd, sizeof cmd);  // the receiver joins while we do
    }
    auto t = factory.Connect(Assignment(0, receiver_), links, Clock::now() + std::chrono::seconds(30));
    Check(t.status(), "sender link");
    transport_ = std::move(*t);
    if (name.rfind("nccl", 0) == 0) {
      int64_t ok;
      ReadAll(ack_fd_, &ok, sizeof ok);
    }
  }

  Row Measure(int64_t bytes) {
    const int64_t elems = std::max<int64_t>(1, bytes / 4);
    at::Tensor t = at::rand({1, elems}, at::TensorOptions().device(at::Device(device_)));
    const int64_t target = device_ == "cpu" ? (int64_t{256} << 20) : (int64_t{512} << 20);
    const int frames = static_cast<int>(std::clamp<int64_t>(target / (elems * 4), 2, 32));
    Row row;
    row.transport = name_;
    row.bytes = elems * 4;
    row.frames = frames;
    row.gbps = static_cast<double>(frames * elems * 4) / Median(t, frames) / 1e9;
    row.latency_us = Median(t, 1) * 1e6;
    return row;
  }

 private:
  // Median seconds of a round of `frames` frames (one warm-up round first).
  double Median(const at::Tensor& t, int frames) {
    Command cmd{Command::kOpen};
    cmd.elems = t.size(1);
    cmd.frames = frames;
    cmd.rounds = rounds_ + 1;
    WriteAll(cmd_fd_, &cmd, sizeof cmd);
    int64_t opened;
    ReadAll(ack_fd_, &opened, sizeof opened);
    std::vector<double> times;
    for (int r = 0; r <= rounds_; ++r) {
      if (t.is_cuda()) t.view(-1)[0].item<float>();  // nothing pending before the clock starts
      const int64_t start = NowNs();
      for (int mb = 0; mb < frames; ++mb) Send(t, r, mb);
      int64_t done;
      ReadAll(ack_fd_, &done, sizeof done);
      if (r > 0) times.push_back(static_cast<double>(done - start) * 1e-9);
    }
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
  }

  void Send(const at::Tensor& t, int step, int mb) {
    v1::TensorFrame h;
    h.set_job_id("bench");
    h.set_phase(v1::PHASE_TRAIN);
    h.set_step(step);
    h.set_micro_batch(mb);
    h.set_kind(v1::FRAME_ACTIVATION);
    h.set_chunk(1);
    if (proto_writer_) {
      Check(EncodeTensor(t, h.mutable_tensor()), "encoding");
      if (!proto_writer_->Write(h)) Check(absl::UnavailableError("the protobuf stream broke"), "sending");
      return;
    }
    h.mutable_tensor()->set_dtype(v1::DTYPE_FLOAT32);
    for (int64_t d : t.sizes()) h.mutable_tensor()->add_shape(d);
    Frame f;
    f.header = std::move(h);
    f.payload = MakeTensorPayload(t);
    Check(transport_->Send(Peer::kDownstream, std::move(f)), "sending");
  }

  const int cmd_fd_, ack_fd_;
  const std::string device_;
  const int rounds_;
  Inbox inbox_;  // the sender's own, for NCCL links (nothing comes back)
  StageDataService data_{&inbox_, "cpu"};
  std::unique_ptr<GrpcServer> server_;
  std::string receiver_, name_;
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<v1::StageData::Stub> proto_stub_;
  std::unique_ptr<grpc::ClientContext> proto_ctx_;
  v1::PushReply proto_reply_;
  std::unique_ptr<grpc::ClientWriter<v1::TensorFrame>> proto_writer_;
};

int64_t ParseSize(const std::string& s) {
  const char unit = s.empty() ? 0 : s.back();
  const int64_t mult = unit == 'K' ? 1024 : unit == 'M' ? (1 << 20) : unit == 'G' ? (int64_t{1} << 30) : 1;
  return std::stoll(mult == 1 ? s : s.substr(0, s.size() - 1)) * mult;
}

std::string SizeName(int64_t b) {
  if (b >= (1 << 20)) return std::to_string(b >> 20) + " MB";
  if (b >= 1024) return std::to_string(b >> 10) + " KB";
  return std::to_string(b) + " B";
}

// The benchmark's command line.
struct BenchFlags {
  std::string sizes = "1K,16K,256K,1M,4M,16M,64M,256M", transports = "proto,grpc,nccl", device = "auto", csv;
  int rounds = 5;
  std::string pair = "0,1";
  std::string log_level = "warn";
};

void AddBenchFlags(CLI::App& app, BenchFlags* f) {
  app.add_option("--sizes", f->sizes, "tensor sizes (K, M, G suffixes)")->capture_default_str();
  app.add_option("--transports", f->transports, "proto (baseline), grpc, nccl, nccl-grpc (headers on the gRPC stream)")
      ->capture_default_str();
  app.add_option("--device", f->device, "auto, cpu or cuda (two GPUs, see --gpus)")->capture_default_str();
  app.add_option("--gpus", f->pair, "with cuda: the sender's and the receiver's GPU")->capture_default_str();
  app.add_option("--rounds", f->rounds, "timed rounds per measurement")->capture_default_str();
  app.add_option("--csv", f->csv, "also write the table here");
  app.add_option("--nccl-ctas", nccl_ctas, "thread blocks per NCCL communicator (a job's nccl_ctas; 0: NCCL's default)")
      ->capture_default_str();
  app.add_option("--log-level", f->log_level, "the processes' log level")->capture_default_str();
}

// Counts the GPUs in a child: no CUDA before the fork. False where no pipe
// could be made.
bool BenchCountGpus(int* gpus) {
  int p[2];
  if (pipe(p) != 0) return false;
  pid_t c = fork();
  if (c == 0) {
    int n = CudaDeviceCount();
    WriteAll(p[1], &n, sizeof n);
    std::_Exit(0);
  }
  ReadAll(p[0], gpus, sizeof *gpus);
  waitpid(c, nullptr, 0);
  return true;
}

// Where the two processes run.
struct BenchDevices {
  bool cuda = false;
  std::string sender, receiver;
};

// The devices --device and --gpus name among the `gpus` here; false, said
// on stderr, where they are not there.
bool BenchPickDevices(const BenchFlags& f, int gpus, BenchDevices* d) {
  d->cuda = f.device == "cuda" || (f.device == "auto" && gpus >= 2);
  if (d->cuda && gpus < 2) {
    std::cerr << "--device cuda needs 2 GPUs, found " << gpus << std::endl;
    return false;
  }
  int send_gpu = 0, recv_gpu = 1;
  if (std::sscanf(f.pair.c_str(), "%d,%d", &send_gpu, &recv_gpu) != 2 || send_gpu < 0 || recv_gpu < 0 ||
      send_gpu == recv_gpu || (d->cuda && std::max(send_gpu, recv_gpu) >= gpus)) {
    std::cerr << "--gpus wants two different GPUs of the " << gpus << " here, like 0,1" << std::endl;
    return false;
  }
  d->sender = d->cuda ? "cuda:" + std::to_string(send_gpu) : "cpu";
  d->receiver = d->cuda ? "cuda:" + std::to_string(recv_gpu) : "cpu";
  return true;
}

// Forks the receiver, then measures each transport in `names` at each of
// `sizes`, printing the table as it goes. False where no pipe could be made.
bool BenchMeasureAll(const std::vector<std::string>& names, const std::string& sizes, const BenchDevices& d,
                     int rounds, std::vector<Row>* rows) {
  int cmd[2], ack[2];
  if (pipe(cmd) != 0 || pipe(ack) != 0) return false;
  pid_t child = fork();
  if (child == 0) Receiver(cmd[0], ack[1], d.receiver);

  {
    Sender sender(cmd[1], ack[0], d.sender, rounds);
    std::printf("%s -> %s, two processes on loopback, median of %d rounds\n", d.sender.c_str(), d.receiver.c_str(),
                rounds);
    std::printf("%-6s %10s %7s %12s %14s\n", "link", "size", "frames", "GB/s", "latency (us)");
    for (const std::string& name : names) {
      sender.Connect(name);
      std::stringstream ss(sizes);
      for (std::string s; std::getline(ss, s, ',');) {
        Row r = sender.Measure(ParseSize(s));
        std::printf("%-6s %10s %7d %12.3f %14.1f\n", r.transport.c_str(), SizeName(r.bytes).c_str(), r.frames, r.gbps,
                    r.latency_us);
        std::fflush(stdout);
        rows->push_back(r);
      }
    }
  }
  waitpid(child, nullptr, 0);
  return true;
}

void BenchWriteCsv(const std::string& csv, const std::vector<Row>& rows, const BenchDevices& d) {
  std::ofstream out(csv);
  out << "transport,bytes,frames_per_round,gb_per_s,latency_us,device,nccl_ctas,sender,receiver\n";
  for (const Row& r : rows)
    out << r.transport << "," << r.bytes << "," << r.frames << "," << r.gbps << "," << r.latency_us << ","
        << (d.cuda ? "cuda" : "cpu") << "," << nccl_ctas << "," << d.sender << "," << d.receiver << "\n";
}

}  // namespace
}  // namespace conveyor

int main(int argc, char** argv) {
  using namespace conveyor;
  CLI::App app{"Conveyor transport benchmark: GB/s and latency per transport and tensor size, two processes"};
  BenchFlags flags;
  AddBenchFlags(app, &flags);
  CLI11_PARSE(app, argc, argv);
  ConfigureLogging(flags.log_level, "bench");

  int gpus = 0;
  if (flags.device != "cpu" && !BenchCountGpus(&gpus)) return 1;
  BenchDevices devices;
  if (!BenchPickDevices(flags, gpus, &devices)) return 1;
  std::vector<std::string> names;
  std::stringstream ts(flags.transports);
  for (std::string t; std::getline(ts, t, ',');)
    if (t.rfind("nccl", 0) != 0 || (devices.cuda && NcclBuilt())) names.push_back(t);

  std::vector<Row> rows;
  if (!BenchMeasureAll(names, flags.sizes, devices, flags.rounds, &rows)) return 1;
  if (!flags.csv.empty()) BenchWriteCsv(flags.csv, rows, devices);
  // Skip static destructors (see cli/conveyor_main.cpp).
  std::fflush(nullptr);
  std::_Exit(0);
}
