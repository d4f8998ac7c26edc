// gRPC plumbing shared by servers and clients: channels with keepalive, a
// bounded wait for a connection, deadlines, port files.
#pragma once

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "common/security.h"
#include "common/status.h"

namespace conveyor {

// Largest message a server accepts; larger ones get RESOURCE_EXHAUSTED before
// they are buffered.
constexpr int kMaxMessageBytes = 1 << 30;

// A channel with keepalive pings (a peer that vanishes without a reset is
// noticed) and no send-size limit, secured as this process is configured
// (SetProcessTls in common/security.h): mutual TLS, or insecure by default.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address);
// The same with explicit security (nullopt: insecure), for tests and tools
// that act as another client than the process.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address, const std::optional<TlsOptions>& tls);

// UNAVAILABLE naming `what` and the address unless the channel connects by
// `deadline`.
Status WaitConnected(grpc::Channel& channel, const std::string& what, const std::string& address,
                     std::chrono::system_clock::time_point deadline);

std::chrono::system_clock::time_point DeadlineAfter(double seconds);

// A gRPC target checked before anyone dials it: HOST:PORT (a name, an IPv4
// address or a bracketed IPv6 one, and a port from 1 to 65535, or 0 where
// `listen` allows "pick a free one"), or a target with a gRPC scheme
// ("dns:///", "ipv4:", "unix:"), passed through. INVALID_ARGUMENT naming
// `what` ("--coordinator") and what is wrong.
Status CheckAddress(const std::string& address, const std::string& what, bool listen = false);

// Why a call to a peer failed, in a user's words, from gRPC's message for an
// UNAVAILABLE call: "connection refused", "host 'x' not found", ...; the
// message itself where it is none of those.
std::string DescribeUnreachable(const std::string& grpc_message);


}  // namespace conveyor
