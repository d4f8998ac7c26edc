// libFuzzer target: a .pt2 archive (torch.export.save) a job names as
// `model.exported`, through the program reader (model/exported/archive.cpp):
// its graph, signature, symbolic sizes and each call's arguments, then every
// state tensor read from the archive. The input's first byte picks one of
// tests/fixtures/pt2's programs, the rest replaces that archive's
// models/model.json (a zip of mutated bytes would rarely get past the zip's
// checksums to the reader). Needs LibTorch (its dispatcher and serializer):
// built with -DCONVEYOR_FUZZ_TORCH=ON (bench/fuzz/run.sh exported_program).
#include <unistd.h>

#include <caffe2/serialize/inline_container.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "model/exported/program.h"

namespace {

using Records = std::vector<std::pair<std::string, std::string>>;

// The fixtures' records, read once, in the order bench/fuzz/seeds/make_seeds.py
// gives their seeds' first byte.
const std::vector<Records>& Bases() {
  static const std::vector<Records> bases = [] {
    std::vector<Records> out;
    for (const char* name : {"cnn", "mlp", "dec", "dec_dyn", "dec_heads", "dec_ids", "dec_mask", "dec_math",
                             "dec_pair", "dec_shared", "gpt_dyn"}) {
      caffe2::serialize::PyTorchStreamReader in(std::string(CONVEYOR_SOURCE_DIR) + "/tests/fixtures/pt2/" + name +
                                                ".pt2");
      Records records;
      for (const std::string& record : in.getAllRecords()) {
        auto [data, size] = in.getRecord(record);
        records.emplace_back(record, std::string(static_cast<const char*>(data.get()), size));
      }
      out.push_back(std::move(records));
    }
    return out;
  }();
  return bases;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const Records& base = Bases()[data[0] % Bases().size()];
  static const std::string path = "/dev/shm/conveyor-fuzz-" + std::to_string(getpid()) + ".pt2";
  {
    caffe2::serialize::PyTorchStreamWriter out(path);
    for (const auto& [record, bytes] : base) {
      if (record == "models/model.json") {
        out.writeRecord(record, data + 1, size - 1);
      } else {
        out.writeRecord(record, bytes.data(), bytes.size());
      }
    }
    out.writeEndOfFile();
  }
  auto program = conveyor::exported::ReadProgram(path, "");
  if (!program.ok()) return 0;
  // The stage's load (model/exported_program.cpp ReadState) catches what a
  // damaged archive throws; anything else escapes and is a finding.
  for (const std::string& name : (*program)->state_order) {
    try {
      (void)conveyor::exported::ReadWeight(**program, name);
    } catch (const std::exception&) {
    }
  }
  return 0;
}
