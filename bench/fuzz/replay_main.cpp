// A main() for a libFuzzer target without libFuzzer: each file named, or each
// file in each folder named, goes once through LLVMFuzzerTestOneInput. Built
// by any compiler with the sanitizers (tests/sanitizers: CI replays the .pt2
// target's seeds and corpus under gcc's ASan+UBSan); a report or a crash is
// the failure, as under libFuzzer.
//   replay_TARGET PATH...
#include <sys/stat.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "common/files.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

int Replay(const std::string& file) {
  auto bytes = conveyor::ReadWholeFile(file);
  if (!bytes.ok()) {
    std::fprintf(stderr, "replay: %s\n", std::string(bytes.status().message()).c_str());
    return 1;
  }
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes->data()), bytes->size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s FILE_OR_FOLDER...\n", argv[0]);
    return 2;
  }
  int inputs = 0, failed = 0;
  for (int i = 1; i < argc; ++i) {
    struct stat st {};
    if (stat(argv[i], &st) != 0) {
      std::fprintf(stderr, "replay: no %s\n", argv[i]);
      return 1;
    }
    std::vector<std::string> files;
    if (S_ISDIR(st.st_mode)) {
      for (const std::string& name : conveyor::ListDir(argv[i])) files.push_back(std::string(argv[i]) + "/" + name);
      std::sort(files.begin(), files.end());
    } else {
      files.push_back(argv[i]);
    }
    for (const std::string& file : files) {
      failed += Replay(file);
      ++inputs;
    }
  }
  std::printf("replay: %d inputs, none crashed\n", inputs - failed);
  return failed == 0 && inputs > 0 ? 0 : 1;
}
