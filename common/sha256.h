// SHA-256 and hex, torch-free: checkpoint checksums, a job's spec digest,
// and the second level of param_digest (Partition::LayerDigest in model/partition.h makes the first).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

struct evp_md_ctx_st;

namespace conveyor {

// Incremental SHA-256 (OpenSSL).
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void Update(const void* data, std::size_t n);
  void Update(std::string_view s) { Update(s.data(), s.size()); }
  // The 32 raw bytes; call once.
  std::string Final();

 private:
  evp_md_ctx_st* ctx_;
};

std::string HexString(std::string_view bytes);

// param_digest: the hex SHA-256 over the layer digests (Partition::LayerDigest's
// LayerDigest, raw), in model order.
std::string CombineDigests(const std::vector<std::string>& layer_digests);

}  // namespace conveyor
