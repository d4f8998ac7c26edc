// libFuzzer target: a torch.save file a job names (a state_dict to start
// from, a `format: tensors` data file), read by torch_format/torch_file.h without
// LibTorch: the zip's records, then the restricted unpickler over data.pkl and
// every tensor's extent within its storage. What opens must give every
// tensor's bytes.
#include <cstddef>
#include <cstdint>
#include <string>

#include "torch_format/torch_file.h"

namespace {

void Walk(const conveyor::TorchFile& file, const conveyor::PickleValue& v, int depth) {
  if (v.kind == conveyor::PickleValue::Kind::kTensor) {
    const std::string bytes = file.ContiguousBytes(v.tensor);
    if (static_cast<int64_t>(bytes.size()) != v.tensor.numel() * conveyor::TorchDTypeSize(v.tensor.dtype))
      __builtin_trap();  // Open checked the extent: the copy is whole
  }
  if (depth > 64) return;
  for (const auto& item : v.items) Walk(file, item, depth + 1);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file = conveyor::TorchFile::FromBytes(std::string(reinterpret_cast<const char*>(data), size), "fuzz.pt");
  if (!file.ok()) return 0;
  Walk(**file, (*file)->root(), 0);
  (void)(*file)->TensorEntries();
  return 0;
}
