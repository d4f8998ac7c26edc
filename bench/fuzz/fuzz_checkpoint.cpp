// libFuzzer target: a stage's checkpoint file as read back after a restart
// (stage_server/checkpoint.h's ParseCheckpoint): magic, header length, the
// CheckpointHeader proto, the payload's length. The first byte picks whether
// the rest is the whole file (mostly refused by its checksum) or the file
// without its SHA-256, which is appended so that the header is parsed. The
// payload itself (the stage's LibTorch archive) is LibTorch's to read.
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/sha256.h"
#include "stage_server/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  std::string file(reinterpret_cast<const char*>(data + 1), size - 1);
  if (data[0] & 1) {
    conveyor::Sha256 sum;
    sum.Update(file.data(), file.size());
    file += sum.Final();
  }
  conveyor::v1::CheckpointHeader header;
  auto payload = conveyor::ParseCheckpoint(file, "fuzz.ckpt", &header);
  if (payload.ok() && static_cast<int64_t>(payload->size()) != header.payload_bytes())
    __builtin_trap();  // the header's length was checked
  return 0;
}
