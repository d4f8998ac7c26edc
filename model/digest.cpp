#include "model/digest.h"

#include <torch/nn/module.h>

#include "common/sha256.h"

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

}  // namespace conveyor
