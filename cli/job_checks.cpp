#include "cli/job_checks.h"

#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "torch_format/torch_file.h"
#include "plan/job_spec.h"

namespace conveyor::cli {
namespace {

// Whether the file starts as text does (a CSV, a JSON file): its first
// kilobyte printable ASCII or whitespace.
bool LooksLikeText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char head[1024];
  in.read(head, sizeof head);
  const std::streamsize n = in.gcount();
  if (n <= 0) return false;
  for (std::streamsize i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(head[i]);
    if (c < 0x20 && c != '\n' && c != '\r' && c != '\t') return false;
    if (c >= 0x7f) return false;
  }
  return true;
}

// A tensors file is torch.save's zip: read its directory and pickle (the
// file is mapped, not read whole), not its tensors.
Status CheckTensorsFile(const std::string& key, const std::string& path) {
  auto file = TorchFile::Open(path);
  if (file.ok()) return absl::OkStatus();
  return Status(file.status().code(),
                key + ": " + std::string(file.status().message()) +
                    (LooksLikeText(path) ? "; it is text (a CSV file?), " : "; ") +
                    "data: {format: tensors} reads files written by torch.save({\"inputs\": X, \"targets\": Y}, "
                    "PATH), X and Y tensors whose first dimension is the sample");
}

}  // namespace

Status CheckJobBeforeStart(const v1::JobSpec& spec) {
  CONVEYOR_RETURN_IF_ERROR(CheckSavePath(spec.save_path()));
  const v1::DataSpec& data = spec.data();
  if (data.kind() != v1::DATA_TENSORS) return absl::OkStatus();
  std::vector<std::pair<std::string, std::string>> files;
  if (data.train_shards_size() > 0) {
    for (const std::string& shard : data.train_shards()) files.emplace_back("data.train", shard);
  } else if (!data.train().empty()) {
    files.emplace_back("data.train", data.train());
  }
  if (!data.test().empty()) files.emplace_back("data.test", data.test());
  for (const auto& [key, path] : files) CONVEYOR_RETURN_IF_ERROR(CheckTensorsFile(key, path));
  return absl::OkStatus();
}

}  // namespace conveyor::cli
