// Authenticated channels: mutual TLS for every gRPC connection, and the bearer
// token that guards the coordinator's mutating calls. Torch-free.
//
// A process configures its TLS once, at start-up, before it makes a channel or
// a server (SetProcessTls); MakeChannel (common/net.h) and GrpcServer
// (common/server.h) then use it for every connection. Without it every
// connection is insecure, as before. See docs/security.md.
#pragma once

#include <grpcpp/client_context.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/support/string_ref.h>

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "common/status.h"

namespace CLI {
class App;
}

namespace conveyor {

// Paths as given on the command line.
struct TlsFiles {
  std::string cert;         // --tls-cert: this process's certificate chain (PEM)
  std::string key;          // --tls-key: its private key (PEM)
  std::string ca;           // --tls-ca: the CA(s) that peers' certificates must chain to (PEM)
  std::string server_name;  // --tls-server-name: the name servers' certificates must carry
                            // instead of the host dialled (optional)
};

// The files' contents, checked.
struct TlsOptions {
  std::string cert_pem;
  std::string key_pem;
  std::string ca_pem;
  std::string server_name;  // empty: check the host of the address dialled
};

// Adds --tls-cert, --tls-key, --tls-ca and --tls-server-name to `app`,
// writing into `files` (which must outlive parsing). With `env_prefix` (e.g.
// "CONVEYOR_"), an unset flag falls back to PREFIX TLS_CERT, TLS_KEY, TLS_CA,
// TLS_SERVER_NAME from the environment.
void AddTlsFlags(CLI::App& app, TlsFiles* files, const char* env_prefix = nullptr);

// No flags: nullopt (insecure). All three of cert, key and ca: their contents,
// with the key checked against the certificate. Otherwise INVALID_ARGUMENT
// naming the missing flags; NOT_FOUND naming a file that cannot be read;
// INVALID_ARGUMENT naming a file that holds no usable PEM certificate or key,
// or a key that does not belong to the certificate.
StatusOr<std::optional<TlsOptions>> LoadTls(const TlsFiles& files);

// Server side: presents the certificate and requires every client to present
// one that chains to the CA (GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY).
// Insecure when `tls` is nullopt.
std::shared_ptr<grpc::ServerCredentials> ServerCredentials(const std::optional<TlsOptions>& tls);
// Client side: verifies the server's certificate against the CA and presents
// this process's certificate. Insecure when `tls` is nullopt. The server-name
// override is a channel argument: MakeChannel sets it.
std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials(const std::optional<TlsOptions>& tls);

// The process-wide configuration. REQUIRES: SetProcessTls is called at most
// once, in main(), before any thread makes a channel or a server; ProcessTls
// is then safe from any thread.
void SetProcessTls(std::optional<TlsOptions> tls);
const std::optional<TlsOptions>& ProcessTls();

// LoadTls then SetProcessTls, for main(): logs what was configured, or prints
// the problem to stderr as "PROGRAM: error: ..." and returns false (the
// program then exits with 2, a usage error).
bool ConfigureTls(const TlsFiles& files, const std::string& program);

// ---------------------------------------------------------------- tokens --

// The token in `text`, without surrounding white space. INVALID_ARGUMENT when
// there is none, or when it holds white space or anything but printable
// ASCII; the message names `source`, never the token.
StatusOr<std::string> ParseToken(const std::string& text, const std::string& source);
// ParseToken of the file's contents; NOT_FOUND when it cannot be read.
StatusOr<std::string> ReadTokenFile(const std::string& path);

// Sends `token` as "authorization: Bearer TOKEN"; nothing when it is empty.
void AddBearerToken(grpc::ClientContext* context, const std::string& token);

// OK when `expected` is empty or the metadata carries "authorization: Bearer
// EXPECTED"; compares in constant time. UNAUTHENTICATED otherwise: "this
// coordinator requires a token" when none was sent, "the token was not
// accepted" when another was (the message never says how it differs).
Status CheckBearerToken(const std::multimap<grpc::string_ref, grpc::string_ref>& metadata,
                        const std::string& expected);

}  // namespace conveyor
