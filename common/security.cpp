#include "common/security.h"

#include <openssl/bio.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/sha.h>
#include <openssl/x509.h>

#include <CLI/CLI.hpp>
#include <array>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string_view>
#include <utility>

#include "common/logging.h"

namespace conveyor {
namespace {

constexpr char kAuthorizationKey[] = "authorization";
constexpr char kBearer[] = "Bearer ";

StatusOr<std::string> ReadWholeFile(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError("cannot read " + what + " " + path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

template <typename T, void (*Free)(T*)>
struct Deleter {
  void operator()(T* p) const { Free(p); }
};
using X509Ptr = std::unique_ptr<X509, Deleter<X509, X509_free>>;
using KeyPtr = std::unique_ptr<EVP_PKEY, Deleter<EVP_PKEY, EVP_PKEY_free>>;
using BioPtr = std::unique_ptr<BIO, Deleter<BIO, BIO_free_all>>;

BioPtr MemoryBio(const std::string& pem) { return BioPtr(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()))); }

// The first certificate in `pem`; null when there is none.
X509Ptr FirstCertificate(const std::string& pem) {
  BioPtr bio = MemoryBio(pem);
  return X509Ptr(bio ? PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr) : nullptr);
}

std::string Subject(X509* cert) {
  char buf[256];
  X509_NAME_oneline(X509_get_subject_name(cert), buf, sizeof buf);
  return buf;
}

// Checks the three PEM texts; the messages name the flag and the file.
Status CheckPem(const TlsFiles& files, const TlsOptions& tls) {
  X509Ptr cert = FirstCertificate(tls.cert_pem);
  if (!cert) return absl::InvalidArgumentError("--tls-cert " + files.cert + " holds no PEM certificate");
  if (!FirstCertificate(tls.ca_pem)) return absl::InvalidArgumentError("--tls-ca " + files.ca + " holds no PEM certificate");
  BioPtr bio = MemoryBio(tls.key_pem);
  // No passphrase callback: OpenSSL's default would prompt on the terminal.
  pem_password_cb* no_passphrase = [](char*, int, int, void*) { return 0; };
  KeyPtr key(bio ? PEM_read_bio_PrivateKey(bio.get(), nullptr, no_passphrase, nullptr) : nullptr);
  if (!key) return absl::InvalidArgumentError("--tls-key " + files.key + " holds no unencrypted PEM private key");
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    return absl::InvalidArgumentError("--tls-key " + files.key + " is not the key of the certificate in " +
                                      files.cert);
  }
  return absl::OkStatus();
}

std::optional<TlsOptions>& ProcessTlsSlot() {
  static std::optional<TlsOptions>* tls = new std::optional<TlsOptions>();  // never destroyed
  return *tls;
}

std::array<unsigned char, SHA256_DIGEST_LENGTH> Sha256(std::string_view text) {
  std::array<unsigned char, SHA256_DIGEST_LENGTH> out{};
  SHA256(reinterpret_cast<const unsigned char*>(text.data()), text.size(), out.data());
  return out;
}

}  // namespace

void AddTlsFlags(CLI::App& app, TlsFiles* files, const char* env_prefix) {
  struct Flag {
    const char* name;
    const char* env;
    std::string* target;
    const char* help;
  };
  const Flag flags[] = {
      {"--tls-cert", "TLS_CERT", &files->cert, "this process's certificate (PEM); with --tls-key and --tls-ca: mutual TLS"},
      {"--tls-key", "TLS_KEY", &files->key, "the certificate's private key (PEM)"},
      {"--tls-ca", "TLS_CA", &files->ca, "CA certificate(s) (PEM) that peers' certificates must chain to"},
      {"--tls-server-name", "TLS_SERVER_NAME", &files->server_name,
       "name that servers' certificates must carry, instead of the host dialled"},
  };
  for (const Flag& f : flags) {
    CLI::Option* option = app.add_option(f.name, *f.target, f.help);
    if (env_prefix) option->envname(std::string(env_prefix) + f.env);
  }
}

StatusOr<std::optional<TlsOptions>> LoadTls(const TlsFiles& files) {
  std::string missing;
  int given = 0;
  for (const auto& [flag, path] : {std::pair<const char*, const std::string*>{"--tls-cert", &files.cert},
                                   {"--tls-key", &files.key},
                                   {"--tls-ca", &files.ca}}) {
    if (path->empty()) missing += std::string(missing.empty() ? "" : " and ") + flag;
    else ++given;
  }
  if (given == 0) {
    if (!files.server_name.empty())
      return absl::InvalidArgumentError("--tls-server-name needs --tls-cert, --tls-key and --tls-ca");
    return std::optional<TlsOptions>();
  }
  if (!missing.empty()) {
    return absl::InvalidArgumentError("--tls-cert, --tls-key and --tls-ca go together: missing " + missing);
  }
  TlsOptions tls;
  CONVEYOR_ASSIGN_OR_RETURN(tls.cert_pem, ReadWholeFile(files.cert, "--tls-cert"));
  CONVEYOR_ASSIGN_OR_RETURN(tls.key_pem, ReadWholeFile(files.key, "--tls-key"));
  CONVEYOR_ASSIGN_OR_RETURN(tls.ca_pem, ReadWholeFile(files.ca, "--tls-ca"));
  tls.server_name = files.server_name;
  CONVEYOR_RETURN_IF_ERROR(CheckPem(files, tls));
  return std::optional<TlsOptions>(std::move(tls));
}

std::shared_ptr<grpc::ServerCredentials> ServerCredentials(const std::optional<TlsOptions>& tls) {
  if (!tls) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions options(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_root_certs = tls->ca_pem;
  options.pem_key_cert_pairs.push_back({tls->key_pem, tls->cert_pem});
  return grpc::SslServerCredentials(options);
}

std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials(const std::optional<TlsOptions>& tls) {
  if (!tls) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = tls->ca_pem;
  options.pem_private_key = tls->key_pem;
  options.pem_cert_chain = tls->cert_pem;
  return grpc::SslCredentials(options);
}

void SetProcessTls(std::optional<TlsOptions> tls) { ProcessTlsSlot() = std::move(tls); }

const std::optional<TlsOptions>& ProcessTls() { return ProcessTlsSlot(); }

bool ConfigureTls(const TlsFiles& files, const std::string& program) {
  auto tls = LoadTls(files);
  if (!tls.ok()) {
    std::fprintf(stderr, "%s: error: %s\n", program.c_str(), std::string(tls.status().message()).c_str());
    return false;
  }
  if (!*tls) {
    LOG_INFO("no TLS: connections are neither encrypted nor authenticated");
  } else {
    LOG_INFO("mutual TLS as ", Subject(FirstCertificate((*tls)->cert_pem).get()), " (", files.cert,
             "), peers checked against ", files.ca,
             (*tls)->server_name.empty() ? "" : ", servers must be named " + (*tls)->server_name);
  }
  SetProcessTls(std::move(*tls));
  return true;
}

// ---------------------------------------------------------------- tokens --

StatusOr<std::string> ParseToken(const std::string& text, const std::string& source) {
  const auto begin = text.find_first_not_of(" \t\r\n");
  if (begin == std::string::npos) return absl::InvalidArgumentError(source + " holds no token");
  const auto end = text.find_last_not_of(" \t\r\n");
  std::string token = text.substr(begin, end - begin + 1);
  for (unsigned char c : token) {
    // What an HTTP/2 header value may carry, less white space.
    if (c < 0x21 || c > 0x7e)
      return absl::InvalidArgumentError(source + " holds white space or non-ASCII characters within the token");
  }
  return token;
}

StatusOr<std::string> ReadTokenFile(const std::string& path) {
  CONVEYOR_ASSIGN_OR_RETURN(std::string text, ReadWholeFile(path, "token file"));
  return ParseToken(text, "token file " + path);
}

void AddBearerToken(grpc::ClientContext* context, const std::string& token) {
  if (!token.empty()) context->AddMetadata(kAuthorizationKey, kBearer + token);
}

Status CheckBearerToken(const std::multimap<grpc::string_ref, grpc::string_ref>& metadata,
                        const std::string& expected) {
  if (expected.empty()) return absl::OkStatus();
  auto it = metadata.find(kAuthorizationKey);
  if (it == metadata.end()) return absl::UnauthenticatedError("this coordinator requires a token");
  const std::string_view value(it->second.data(), it->second.size());
  const std::string_view prefix(kBearer);
  const bool bearer = value.substr(0, prefix.size()) == prefix;
  const std::string_view sent = bearer ? value.substr(prefix.size()) : value;
  // Hashing first makes the comparison's time independent of both lengths.
  if (!bearer || CRYPTO_memcmp(Sha256(sent).data(), Sha256(expected).data(), SHA256_DIGEST_LENGTH) != 0)
    return absl::UnauthenticatedError("the token was not accepted");
  return absl::OkStatus();
}

}  // namespace conveyor
