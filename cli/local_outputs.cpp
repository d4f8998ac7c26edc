#include "cli/local_outputs.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace conveyor::cli {
namespace {

// Creates `path` empty unless it exists (O_EXCL: of two runs at once, one
// gets it). EEXIST: false with no error.
StatusOr<bool> CreateNew(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd >= 0) {
    ::close(fd);
    return true;
  }
  if (errno == EEXIST) return false;
  return absl::PermissionDeniedError("cannot create " + path + ": " + std::strerror(errno));
}

}  // namespace

namespace {

StatusOr<std::string> ReserveBesideWeights(const std::string& save_path) {
  const std::filesystem::path weights(save_path);
  std::error_code ignored;
  std::filesystem::create_directories(weights.parent_path(), ignored);  // as the weights' writer does
  const std::string stem = (weights.parent_path() / weights.stem()).string() + "-curves";
  for (int n = 1; n < 10000; ++n) {
    const std::string path = stem + (n == 1 ? "" : "-" + std::to_string(n)) + ".png";
    CONVEYOR_ASSIGN_OR_RETURN(bool made, CreateNew(path));
    if (made) return path;
  }
  return absl::ResourceExhaustedError(stem + ".png and 9998 more names beside it exist");
}

}  // namespace

StatusOr<std::string> ReserveCurvesPicture(const std::string& save_path, const std::string& run_dir) {
  if (!save_path.empty()) {
    auto beside = ReserveBesideWeights(save_path);
    if (beside.ok()) return beside;  // else the run's folder, which no other run writes
  }
  const std::string path = run_dir + "/curves.png";
  CONVEYOR_ASSIGN_OR_RETURN(bool made, CreateNew(path));
  if (!made) return absl::AlreadyExistsError(path + " exists");
  return path;
}

std::string RescuedWeightsPath(const std::string& save_path, const std::string& run_dir) {
  return run_dir + "/" + std::filesystem::path(save_path).filename().string();
}

}  // namespace conveyor::cli
