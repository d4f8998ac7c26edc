#include "common/sha256.h"

#include <openssl/evp.h>

namespace conveyor {

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) { EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr); }
Sha256::~Sha256() { EVP_MD_CTX_free(ctx_); }
void Sha256::Update(const void* data, std::size_t n) { EVP_DigestUpdate(ctx_, data, n); }
std::string Sha256::Final() {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_DigestFinal_ex(ctx_, out, &n);
  return std::string(reinterpret_cast<char*>(out), n);
}

std::string HexString(std::string_view bytes) {
  static const char* kHex = "0123456789abcdef";
  std::string hex;
  hex.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    hex.push_back(kHex[c >> 4]);
    hex.push_back(kHex[c & 15]);
  }
  return hex;
}

std::string CombineDigests(const std::vector<std::string>& layer_digests) {
  Sha256 h;
  for (const auto& d : layer_digests) h.Update(d);
  return HexString(h.Final());
}

}  // namespace conveyor
