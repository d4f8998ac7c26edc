// param_digest: a hex SHA-256 over the model's parameters in model order,
// independent of the partition (each layer is hashed alone, then the layer
// hashes are hashed in order).
#pragma once

#include <string>
#include <vector>

namespace torch::nn {
class Module;
}  // namespace torch::nn

namespace conveyor {

// Raw SHA-256 (32 bytes) of one layer's parameters: names, dtypes, shapes, bytes.
std::string LayerDigest(const torch::nn::Module& layer);
// CombineDigests (common/sha256.h, torch-free) makes param_digest of them.

}  // namespace conveyor
