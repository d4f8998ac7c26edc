#include "common/digest.h"

#include <torch/nn/module.h>

#include "common/files.h"

namespace conveyor {

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
  return HexString(h.Final());
}

}  // namespace conveyor
