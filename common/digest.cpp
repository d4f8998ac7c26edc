#include "common/digest.h"

#include <openssl/evp.h>
#include <torch/nn/module.h>

#include <memory>

namespace conveyor {
namespace {

class Sha256 {
 public:
  Sha256() : ctx_(EVP_MD_CTX_new(), EVP_MD_CTX_free) { EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr); }
  void Update(const void* data, std::size_t n) { EVP_DigestUpdate(ctx_.get(), data, n); }
  void Update(const std::string& s) { Update(s.data(), s.size()); }
  std::string Final() {
    unsigned char out[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    EVP_DigestFinal_ex(ctx_.get(), out, &n);
    return std::string(reinterpret_cast<char*>(out), n);
  }

 private:
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx_;
};

}  // namespace

std::string LayerDigest(const torch::nn::Module& layer) {
  Sha256 h;
  for (const auto& p : layer.named_parameters(true)) {
    at::Tensor t = p.value().detach().to(at::kCPU).contiguous();
    h.Update(p.key() + "|" + std::string(c10::toString(t.scalar_type())) + "|");
    for (int64_t d : t.sizes()) h.Update(std::to_string(d) + ",");
    h.Update(t.data_ptr(), t.numel() * t.element_size());
  }
  return h.Final();
}

std::string CombineDigests(const std::vector<std::string>& layer_digests) {
  Sha256 h;
  for (const auto& d : layer_digests) h.Update(d);
  std::string raw = h.Final();
  static const char* kHex = "0123456789abcdef";
  std::string hex;
  for (unsigned char c : raw) {
    hex.push_back(kHex[c >> 4]);
    hex.push_back(kHex[c & 15]);
  }
  return hex;
}

}  // namespace conveyor
