// libFuzzer target: the restricted unpickler alone (torch_format/torch_file.h's
// UnpickleRestricted), over a data.pkl's bytes without the zip around them,
// so that mutations reach the opcodes; persistent ids may name two storages.
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "torch_format/torch_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const uint8_t storage[512] = {};
  const std::map<std::string, conveyor::ByteSpan> storages = {{"0", {storage, sizeof storage}},
                                                             {"1", {storage, 16}}};
  const std::string_view pickle(reinterpret_cast<const char*>(data), size);
  auto value = conveyor::UnpickleRestricted(pickle, storages, "fuzz.pt");
  if (value.ok()) (void)value->TypeName();
  return 0;
}
