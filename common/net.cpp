#include "common/net.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/support/channel_arguments.h>

#include <cctype>
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

Status CheckAddress(const std::string& address, const std::string& what, bool listen) {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(what + ": '" + address + "' " + why +
                                      " (expected HOST:PORT, for example 127.0.0.1:50050)");
  };
  for (const char* scheme : {"dns:", "ipv4:", "ipv6:", "unix:", "unix-abstract:"})
    if (address.rfind(scheme, 0) == 0) return absl::OkStatus();
  if (address.empty()) return bad("is empty");
  const auto colon = address.rfind(':');
  if (colon == std::string::npos) return bad("has no port");
  std::string host = address.substr(0, colon);
  const std::string port = address.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  } else if (host.find(':') != std::string::npos) {
    return bad("is an IPv6 address without brackets");
  }
  if (host.empty()) return bad("has no host");
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos)
    return bad("has no port");
  const int n = std::stoi(port);
  if (n > 65535 || (n == 0 && !listen)) return bad("has port " + port + ", not one from 1 to 65535");
  for (char c : host) {
    const bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_' || c == ':';
    if (!ok) return bad("has a host name with '" + std::string(1, c) + "' in it");
  }
  return absl::OkStatus();
}

std::string DescribeUnreachable(const std::string& message) {
  auto has = [&](const char* s) { return message.find(s) != std::string::npos; };
  if (has("Connection refused")) return "connection refused (nothing listens there: is the server running?)";
  if (has("DNS resolution failed") || has("Domain name not found") || has("Name or service not known")) {
    // "DNS resolution failed for garbage:1: ..." names the target.
    const auto at = message.find(" for ");
    std::string target = at == std::string::npos ? "" : message.substr(at + 5);
    target = target.substr(0, target.find(": "));
    return "host not found" + (target.empty() ? std::string() : " ('" + target.substr(0, target.rfind(':')) + "')");
  }
  if (has("SETTINGS frame")) return "did not answer: it accepts connections but sent no gRPC handshake (is it a Conveyor server?)";
  if (has("No route to host")) return "no route to host";
  if (has("Network is unreachable")) return "network unreachable";
  if (has("Connection reset")) return "connection reset by the peer";
  if (has("Deadline Exceeded") || has("deadline")) return "no answer in time";
  return message;
}

}  // namespace conveyor
