#include "common/net.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/support/channel_arguments.h>

#include <cstdio>
#include <fstream>

namespace conveyor {

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address) {
  return MakeChannel(address, ProcessTls());
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address, const std::optional<TlsOptions>& tls) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // A peer that comes back (a restarted stage, a link up again) is found
  // within a couple of seconds, not gRPC's default of up to two minutes.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 250);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 250);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  args.SetMaxSendMessageSize(-1);
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  // Each channel its own connection: a stage's links must not share one.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  if (tls && !tls->server_name.empty()) args.SetSslTargetNameOverride(tls->server_name);
  return grpc::CreateCustomChannel(address, ChannelCredentials(tls), args);
}

Status WaitConnected(grpc::Channel& channel, const std::string& what, const std::string& address,
                     std::chrono::system_clock::time_point deadline) {
  if (channel.WaitForConnected(deadline)) return absl::OkStatus();
  return absl::UnavailableError(what + " at " + address + " did not answer in time");
}

std::chrono::system_clock::time_point DeadlineAfter(double seconds) {
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(std::chrono::duration<double>(seconds));
}

Status WriteFileAtomically(const std::string& path, const std::string& content) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) return absl::PermissionDeniedError("cannot write " + tmp);
    out << content;
    out.flush();
    if (!out) return absl::DataLossError("writing " + tmp + " failed");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    return absl::PermissionDeniedError("cannot rename " + tmp + " to " + path);
  return absl::OkStatus();
}

}  // namespace conveyor
