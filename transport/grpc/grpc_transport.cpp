#include "transport/grpc/grpc_transport.h"

#include <ATen/ATen.h>
#include <grpcpp/impl/rpc_method.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/sync_stream.h>

#include <atomic>
#include <optional>
#include <thread>
#include <vector>

#include "common/logging.h"
#include "common/net.h"
#include "transport/tensor_codec.h"
#include "conveyor.grpc.pb.h"
#include "transport/grpc/chunk_codec.h"
#include "transport/nccl/header_ring.h"
#include "transport/grpc/cuda_staging.h"
#include "transport/inbox.h"
#include "transport/nccl/nccl_channel.h"
#include "transport/tensor_payload.h"
#include "transport/work_queue.h"

namespace conveyor {
namespace {

using Clock = std::chrono::steady_clock;

constexpr char kPushChunks[] = "/conveyor.v1.StageData/PushChunks";

// Keeps whatever holds a slice's bytes alive until gRPC lets go of the slice.
struct SliceOwner {
  std::shared_ptr<void> keep;
  static void Release(void* p) { delete static_cast<SliceOwner*>(p); }
};

grpc::Slice SliceOver(const char* data, int64_t n, const std::shared_ptr<void>& keep) {
  return grpc::Slice(const_cast<char*>(data), static_cast<size_t>(n), &SliceOwner::Release, new SliceOwner{keep});
}

// How often a thread with NCCL operations in flight looks at them.
constexpr std::chrono::microseconds kNcclPoll{100};

// One stream to one neighbour, and the NCCL channel for the bytes this stage
// sends on it when the link is set up for NCCL. Frames go in Send() order.
class Link {
 public:
  Link(std::string address, std::string label, std::chrono::duration<double> timeout)
      : address_(std::move(address)), label_(std::move(label)),
        timeout_(std::chrono::duration_cast<Clock::duration>(timeout)), queue_("link to " + label_) {}
  ~Link() { Shutdown(); }
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;

  // `nccl`: the channel (rank 0) for this link's bytes, or null for gRPC.
  // `rings`, `ring`: where this end writes NCCL frames' headers if the peer
  // attached to the link's shared memory (null: on the gRPC stream).
  Status Open(std::chrono::system_clock::time_point deadline, std::unique_ptr<NcclChannel> nccl,
              std::shared_ptr<LinkRings> rings = nullptr, HeaderRing* ring = nullptr) {
    nccl_ = std::move(nccl);
    rings_ = std::move(rings);
    ring_ = ring;
    channel_ = MakeChannel(address_);
    CONVEYOR_RETURN_IF_ERROR(WaitConnected(*channel_, label_, address_, deadline));
    writer_.reset(grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(
        channel_.get(), grpc::internal::RpcMethod(kPushChunks, grpc::internal::RpcMethod::CLIENT_STREAMING),
        &context_, &reply_));
    if (!writer_) return absl::UnavailableError("cannot open a stream to " + label_ + " at " + address_);
    thread_ = std::thread([this] { Loop(); });
    return absl::OkStatus();
  }

  v1::LinkKind Kind() const { return nccl_ ? v1::LINK_NCCL : v1::LINK_GRPC; }

  // A tensor for an NCCL link is enqueued on the device here, on the
  // caller's thread, and its header goes into shared memory or after the
  // frames queued for the stream; anything else is queued for the stream.
  Status Send(Frame frame) {
    if (nccl_ && dynamic_cast<TensorPayload*>(frame.payload.get())) return SendOverNccl(std::move(frame));
    return queue_.Push(std::move(frame));
  }

  // OK while the link works.
  Status status() const {
    Status st = queue_.error();
    if (st.ok() && nccl_) st = nccl_->status();
    return st;
  }

  void Shutdown() {
    if (!queue_.Close()) return;
    if (nccl_) nccl_->Abort();
    context_.TryCancel();
    if (thread_.joinable()) thread_.join();
  }

 private:
  enum class Headers { kUndecided, kRing, kGrpc };

  // The header goes before the bytes: NCCL sets up a pair's connection on
  // its first transfer, which waits for the peer's receive, and the peer
  // posts that only once it has the header.
  Status SendOverNccl(Frame frame) {
    auto* tensor = static_cast<TensorPayload*>(frame.payload.get());
    std::unique_lock<std::mutex> lock(nccl_mu_);
    CONVEYOR_RETURN_IF_ERROR(queue_.error());
    const auto deadline = Clock::now() + timeout_;
    Status st;
    if (headers_ == Headers::kUndecided) {
      // Once the communicator is up the peer has attached to the shared
      // memory if it ever will (header_ring.h).
      st = nccl_->WaitReady(deadline);
      if (st.ok()) {
        headers_ = rings_ && rings_->attached() ? Headers::kRing : Headers::kGrpc;
        LOG_INFO("link to ", label_, ": NCCL, frame headers ",
                 headers_ == Headers::kRing ? "in shared memory" : "on the gRPC stream");
      }
    }
    at::Tensor t = tensor->tensor();
    const c10::Event* ready = tensor->ready();
    std::shared_ptr<Payload> keep(std::move(frame.payload));  // `ready` lives in it
    frame.header.set_carrier(v1::CARRIER_NCCL);
    if (st.ok()) {
      // Headers, in shared memory or queued for the stream, go in the order
      // of the sends: all under the lock.
      st = headers_ == Headers::kRing ? ring_->Push(frame.header.SerializeAsString(), deadline)
                                      : queue_.Push(std::move(frame));
    }
    if (st.ok()) st = nccl_->Send(t, ready, deadline);
    nccl_busy_ = !nccl_->Idle();
    if (!st.ok()) {
      st = Annotate(st, "link to " + label_ + " at " + address_ + " broke");
      queue_.Fail(st);
      return st;
    }
    lock.unlock();
    queue_.Wake();  // the link's thread retires the send
    return absl::OkStatus();
  }

  void Loop() {
    for (;;) {
      std::optional<Frame> frame =
          queue_.Pop(nccl_busy_ ? std::optional<std::chrono::microseconds>(kNcclPoll) : std::nullopt);
      if (queue_.closed()) break;
      Status st;
      // A header first: its sender may be waiting, holding nccl_mu_, for the
      // peer to post the receive that this header asks for.
      if (frame) st = Write(std::move(*frame));
      if (st.ok() && nccl_) {
        std::unique_lock<std::mutex> lock(nccl_mu_, std::try_to_lock);
        if (lock.owns_lock()) {
          st = nccl_->Progress();
          nccl_busy_ = !nccl_->Idle();
        }
      }
      if (!st.ok()) {
        // Shutdown() closes the queue before it cancels the stream: a write
        // that fails after that is our own cancellation, not a broken link.
        if (queue_.closed()) {
          writer_->Finish();
          return;
        }
        if (stream_broken_) {  // the server's status says why
          Status end = FromGrpc(writer_->Finish());
          if (!end.ok()) st = end;
        }
        st = Annotate(st, "link to " + label_ + " at " + address_ + " broke");
        LOG_WARN(st.message());
        queue_.Fail(st);
        return;
      }
    }
    writer_->WritesDone();
    writer_->Finish();
  }

  Status WriteMessage(std::vector<grpc::Slice> slices) {
    grpc::ByteBuffer buffer(slices.data(), slices.size());
    if (!writer_->Write(buffer)) {
      stream_broken_ = true;
      return absl::UnavailableError("stream closed");
    }
    return absl::OkStatus();
  }

  Status Write(Frame frame) {
    if (frame.header.carrier() == v1::CARRIER_NCCL) {  // its bytes are enqueued on NCCL already
      return WriteMessage({grpc::Slice(EncodeChunkPrefix(&frame.header, 0, true, 0))});
    }
    auto* tensor = dynamic_cast<TensorPayload*>(frame.payload.get());
    frame.header.set_carrier(v1::CARRIER_INLINE);
    const int64_t bytes = frame.payload ? frame.payload->bytes() : 0;
    const int pieces = std::max<int>(1, static_cast<int>((bytes + kChunkBytes - 1) / kChunkBytes));
    std::shared_ptr<Payload> payload(std::move(frame.payload));
    std::shared_ptr<void> keep = payload;  // what the slices' bytes live in
    const char* data = nullptr;
    DeviceToHostCopy* copy = nullptr;  // a GPU tensor's pinned host copy, piece by piece
    if (tensor && tensor->tensor().is_cuda()) {
      CONVEYOR_ASSIGN_OR_RETURN(std::unique_ptr<DeviceToHostCopy> staging,
                                DeviceToHostCopy::Start(tensor->tensor(), tensor->ready(), kChunkBytes));
      copy = staging.get();
      data = copy->host();
      keep = std::shared_ptr<DeviceToHostCopy>(std::move(staging));
    } else if (tensor) {
      data = static_cast<const char*>(tensor->tensor().data_ptr());
    } else if (auto* host = dynamic_cast<HostPayload*>(payload.get())) {
      data = host->data().data();
    }
    for (int i = 0; i < pieces; ++i) {
      const int64_t off = i * kChunkBytes, n = std::min(kChunkBytes, bytes - off);
      if (copy) CONVEYOR_RETURN_IF_ERROR(copy->Wait(i));
      std::vector<grpc::Slice> slices;
      slices.emplace_back(EncodeChunkPrefix(i == 0 ? &frame.header : nullptr, off, i + 1 == pieces, n));
      if (n > 0) slices.push_back(SliceOver(data + off, n, keep));
      CONVEYOR_RETURN_IF_ERROR(WriteMessage(std::move(slices)));
    }
    return absl::OkStatus();
  }

  const std::string address_;
  const std::string label_;
  const Clock::duration timeout_;
  std::unique_ptr<NcclChannel> nccl_;  // its calls under nccl_mu_ (Send's caller and the loop's thread)
  std::shared_ptr<LinkRings> rings_;   // shared with this stage's fetcher of the other direction
  HeaderRing* ring_ = nullptr;         // in rings_
  mutable std::mutex nccl_mu_;         // guards nccl_'s calls and headers_
  Headers headers_ = Headers::kUndecided;
  std::atomic<bool> nccl_busy_{false};  // operations in flight: the loop polls
  std::shared_ptr<grpc::Channel> channel_;
  grpc::ClientContext context_;
  grpc::ByteBuffer reply_;
  std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> writer_;
  bool stream_broken_ = false;  // a write failed; the loop's thread only
  WorkQueue<Frame> queue_;
  std::thread thread_;
};

// Receives the bytes of one NCCL link's direction (rank 1) for its frames'
// headers, in their order, on its own thread. The headers come from the
// link's shared memory when both ends use it, else from the inbox (which
// had them from the gRPC stream and checked them). Each frame goes to the
// inbox as soon as its receive is enqueued, with the event that fires when
// its bytes are there. A failure (dead peer, timeout, a bad header) fails
// the stage's step; the channel's status() says so before its receives end.
class NcclFetcher final : public PayloadFetcher {
 public:
  // `rings`, `ring`: the link's shared memory and this direction's ring, or
  // null; whether headers come through them is decided once the
  // communicator is up (header_ring.h).
  NcclFetcher(Inbox* inbox, Peer from, std::unique_ptr<NcclChannel> channel,
              std::chrono::duration<double> timeout, std::shared_ptr<LinkRings> rings, HeaderRing* ring)
      : inbox_(inbox), from_(from), channel_(std::move(channel)),
        timeout_(std::chrono::duration_cast<Clock::duration>(timeout)), rings_(std::move(rings)), ring_(ring),
        queue_("the NCCL link") {
    thread_ = std::thread([this] { Loop(); });
    inbox_->SetFetcher(from_, this);
  }
  ~NcclFetcher() override { Shutdown(); }

  Status Fetch(v1::TensorFrame header) override { return queue_.Push(std::move(header)); }

  Status status() const {
    Status st = queue_.error();
    return st.ok() ? channel_->status() : st;
  }

  void Shutdown() {
    if (!queue_.Close()) return;
    inbox_->SetFetcher(from_, nullptr);  // no Fetch() after this
    channel_->Abort();
    if (thread_.joinable()) thread_.join();
  }

 private:
  // How long a wait on the ring lasts before the thread looks at its queue's
  // state again (Shutdown does not write to the ring the peer shares).
  static constexpr std::chrono::microseconds kRingSlice{10000};

  void Loop() {
    Status st = absl::OkStatus();
    bool from_ring = false;
    if (rings_) {  // both ends decide alike once the communicator is up
      st = channel_->WaitReady(Clock::now() + timeout_);
      from_ring = st.ok() && rings_->attached();
    }
    while (st.ok()) {
      const bool idle = channel_->Idle();
      std::optional<v1::TensorFrame> header;
      if (from_ring) {
        auto got = ring_->Pop(idle ? kRingSlice : kNcclPoll);
        if (queue_.closed()) return;
        if (!got.ok()) {  // the peer closed its end: the link is over
          LOG_INFO("NCCL link: the peer closed the header ring");
          queue_.Fail(got.status());
          return;
        }
        if (*got) st = Parse(**got, &header);
      } else {
        header = queue_.Pop(idle ? std::nullopt : std::optional<std::chrono::microseconds>(kNcclPoll));
        if (queue_.closed()) return;
      }
      if (st.ok()) st = channel_->Progress();
      if (st.ok() && header) st = Post(std::move(*header), from_ring);
    }
    if (queue_.closed()) return;
    LOG_WARN(st.message());
    queue_.Fail(st);
    inbox_->Fail(st);
  }

  Status Parse(const std::string& bytes, std::optional<v1::TensorFrame>* header) {
    v1::TensorFrame h;
    if (!h.ParseFromString(bytes) || h.carrier() != v1::CARRIER_NCCL) {
      return absl::InvalidArgumentError("NCCL link: a malformed frame header in the shared-memory ring");
    }
    *header = std::move(h);
    return absl::OkStatus();
  }

  // `unchecked`: the header did not pass the inbox yet.
  Status Post(v1::TensorFrame header, bool unchecked) {
    if (unchecked) CONVEYOR_RETURN_IF_ERROR(inbox_->CheckHeader(header, -1));
    std::vector<int64_t> shape(header.tensor().shape().begin(), header.tensor().shape().end());
    CONVEYOR_ASSIGN_OR_RETURN(
        NcclChannel::Received received,
        channel_->Receive(shape, FromWireDType(header.tensor().dtype()), Clock::now() + timeout_));
    Frame frame;
    frame.header = std::move(header);
    frame.payload = std::make_unique<TensorPayload>(std::move(received.tensor), std::move(received.ready));
    Status st = inbox_->Deliver(std::move(frame));
    if (!st.ok()) LOG_WARN("refused a tensor: ", st.message());
    return absl::OkStatus();
  }

  Inbox* inbox_;
  const Peer from_;
  std::unique_ptr<NcclChannel> channel_;
  const Clock::duration timeout_;
  std::shared_ptr<LinkRings> rings_;  // shared with this stage's link of the other direction
  HeaderRing* ring_;                  // in rings_
  WorkQueue<v1::TensorFrame> queue_;
  std::thread thread_;
};

class GrpcTransport : public Transport {
 public:
  Status Send(Peer peer, Frame frame) override {
    Link* link = peer == Peer::kUpstream ? up_.get() : down_.get();
    if (!link) return absl::FailedPreconditionError("no neighbour on that side");
    frame.header.set_to_upstream(peer == Peer::kUpstream);
    return link->Send(std::move(frame));
  }
  v1::LinkKind Kind(Peer peer) const override {
    const Link* link = peer == Peer::kUpstream ? up_.get() : down_.get();
    return link ? link->Kind() : v1::LINK_GRPC;
  }
  Status status() const override {
    for (const auto& f : fetchers_) CONVEYOR_RETURN_IF_ERROR(f->status());
    if (up_) CONVEYOR_RETURN_IF_ERROR(up_->status());
    if (down_) CONVEYOR_RETURN_IF_ERROR(down_->status());
    return absl::OkStatus();
  }
  void Shutdown() override {
    // All ends at once: aborting an NCCL communicator takes about a second
    // (NCCL 2.28 on H200s). Two links' aborts of one process still took 2 s
    // together there: NCCL seems to run them one after the other.
    std::vector<std::thread> ends;
    for (auto& f : fetchers_) ends.emplace_back([&f] { f->Shutdown(); });
    if (up_) ends.emplace_back([this] { up_->Shutdown(); });
    if (down_) ends.emplace_back([this] { down_->Shutdown(); });
    for (std::thread& t : ends) t.join();
  }
  ~GrpcTransport() override { Shutdown(); }

  std::unique_ptr<Link> up_, down_;
  std::vector<std::unique_ptr<NcclFetcher>> fetchers_;
};

// This end of an NCCL link, for the link's sending side.
struct NcclEnd {
  std::unique_ptr<NcclChannel> send;
  std::shared_ptr<LinkRings> rings;  // null: headers on the gRPC stream
  HeaderRing* send_ring = nullptr;   // in rings
};

// Joins the NCCL link `setup` as its upstream end (sends activations) or its
// downstream end (sends gradients): a sending channel, a fetcher for the
// other direction (in `t`), and the link's shared memory for their headers
// where both ends have it (the upstream end made it in PrepareLink: `rings`;
// the downstream end attaches here, before it joins).
StatusOr<NcclEnd> JoinNccl(const v1::LinkSetup& setup, bool upstream_end, const std::string& peer,
                           const LinkOptions& options, std::shared_ptr<LinkRings> rings, GrpcTransport* t) {
  if (!options.inbox) return absl::InternalError("NCCL links need the stage's inbox");
  const at::Device device(options.device);
  if (!upstream_end && options.nccl.shm_headers) {
    auto attached = LinkRings::Attach(LinkRings::NameFor(setup.activation_nccl_id()));
    if (attached.ok()) {
      rings = std::move(*attached);
    } else {
      LOG_INFO("NCCL link from ", peer, ": frame headers on the gRPC stream (", attached.status().message(), ")");
    }
  }
  NcclEnd end;
  HeaderRing* receive_ring = nullptr;
  if (rings) {
    end.send_ring = upstream_end ? &rings->activations() : &rings->gradients();
    receive_ring = upstream_end ? &rings->gradients() : &rings->activations();
  }
  const std::string& send_id = upstream_end ? setup.activation_nccl_id() : setup.gradient_nccl_id();
  const std::string& recv_id = upstream_end ? setup.gradient_nccl_id() : setup.activation_nccl_id();
  const std::string what = upstream_end ? "activations to " : "gradients to ";
  CONVEYOR_ASSIGN_OR_RETURN(
      end.send, NcclChannel::Join(send_id, 0, device, options.nccl.ctas, "NCCL link (" + what + peer + ")"));
  CONVEYOR_ASSIGN_OR_RETURN(
      std::unique_ptr<NcclChannel> receive,
      NcclChannel::Join(recv_id, 1, device, options.nccl.ctas,
                        std::string("NCCL link (") + (upstream_end ? "gradients from " : "activations from ") + peer + ")"));
  t->fetchers_.push_back(std::make_unique<NcclFetcher>(options.inbox,
                                                       upstream_end ? Peer::kDownstream : Peer::kUpstream,
                                                       std::move(receive), options.timeout, rings, receive_ring));
  end.rings = std::move(rings);
  return end;
}

// PrepareLink's work for Connect: the downstream link's header rings.
struct NcclPrepared : PreparedLink {
  std::shared_ptr<LinkRings> rings;
};

std::shared_ptr<LinkRings> DownstreamRings(const LinkOptions& options) {
  const auto* made = dynamic_cast<const NcclPrepared*>(options.prepared.get());
  return made && options.nccl.shm_headers ? made->rings : nullptr;
}

}  // namespace

bool GrpcTransportFactory::SupportsNccl() const { return NcclBuilt(); }

StatusOr<v1::LinkSetup> GrpcTransportFactory::PrepareLink(const std::string& device, const NcclOptions& nccl,
                                                          std::shared_ptr<PreparedLink>* prepared) {
  const at::Device d(device);
  if (!d.is_cuda() || !NcclBuilt()) {
    return absl::FailedPreconditionError(device + " cannot use NCCL" +
                                         (d.is_cuda() ? " (not built with NCCL)" : " (not a CUDA device)"));
  }
  v1::LinkSetup link;
  link.set_transport(v1::TRANSPORT_NCCL);
  CONVEYOR_ASSIGN_OR_RETURN(*link.mutable_activation_nccl_id(), NewNcclUniqueId());
  CONVEYOR_ASSIGN_OR_RETURN(*link.mutable_gradient_nccl_id(), NewNcclUniqueId());
  auto made = std::make_shared<NcclPrepared>();
  if (nccl.shm_headers) {
    // Made before the downstream stage hears of the link, so that one on
    // this host finds it when it connects.
    auto rings = LinkRings::Create(LinkRings::NameFor(link.activation_nccl_id()));
    if (rings.ok()) {
      made->rings = std::move(*rings);
    } else {
      LOG_INFO(device, ": NCCL frame headers stay on the gRPC stream: ", rings.status().message());
    }
  }
  *prepared = std::move(made);
  return link;
}

StatusOr<std::unique_ptr<Transport>> GrpcTransportFactory::Connect(const v1::StageAssignment& a,
                                                                   const LinkOptions& options,
                                                                   std::chrono::steady_clock::time_point deadline) {
  auto sys_deadline = std::chrono::system_clock::now() +
                      std::chrono::duration_cast<std::chrono::system_clock::duration>(
                          deadline - std::chrono::steady_clock::now());
  auto t = std::make_unique<GrpcTransport>();
  const int s = a.stage_index(), p = std::max(1, a.num_stages());
  if (!a.upstream().empty()) {
    const std::string peer = "stage " + std::to_string((s + p - 1) % p);
    NcclEnd nccl;
    if (options.upstream.transport() == v1::TRANSPORT_NCCL) {
      CONVEYOR_ASSIGN_OR_RETURN(nccl, JoinNccl(options.upstream, /*upstream_end=*/false, peer, options, nullptr, t.get()));
    }
    t->up_ = std::make_unique<Link>(a.upstream(), peer, options.timeout);
    CONVEYOR_RETURN_IF_ERROR(t->up_->Open(sys_deadline, std::move(nccl.send), std::move(nccl.rings), nccl.send_ring));
  }
  if (!a.downstream().empty()) {
    const std::string peer = "stage " + std::to_string((s + 1) % p);
    NcclEnd nccl;
    if (options.downstream.transport() == v1::TRANSPORT_NCCL) {
      CONVEYOR_ASSIGN_OR_RETURN(nccl, JoinNccl(options.downstream, /*upstream_end=*/true, peer, options,
                                               DownstreamRings(options), t.get()));
    }
    t->down_ = std::make_unique<Link>(a.downstream(), peer, options.timeout);
    CONVEYOR_RETURN_IF_ERROR(t->down_->Open(sys_deadline, std::move(nccl.send), std::move(nccl.rings), nccl.send_ring));
  }
  return std::unique_ptr<Transport>(std::move(t));
}

}  // namespace conveyor
