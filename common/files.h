// Durable files and folders, torch-free: what checkpoints and the job store
// rely on to survive a crash at any instruction.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace conveyor {

// Writes `content` so that after a crash at any point `path` holds either its
// old content or all of the new: a temporary file beside it, fsync, rename,
// fsync of the folder.
Status WriteFileDurably(const std::string& path, std::string_view content);
// The same for content in pieces, written one after the other (no copy).
Status WriteFileDurably(const std::string& path, const std::vector<std::string_view>& pieces);

// Writes `content` to `path` atomically (temporary file, then rename).
Status WriteFileAtomically(const std::string& path, const std::string& content);
// The whole file; NOT_FOUND naming it when it is missing.
StatusOr<std::string> ReadWholeFile(const std::string& path);

// Folder helpers over POSIX calls. std::filesystem's folder walks crashed
// (SIGSEGV) in binaries linked with a PyTorch wheel's LibTorch, whose
// statically linked copy of them takes the place of the system's.
// mkdir -p; PERMISSION_DENIED naming the folder.
Status MakeDirs(const std::string& dir);
// An advisory lock (flock) on DIR/LOCK, held while the object lives. The
// kernel drops it when the process dies, so a killed process leaves nothing
// to clean up. The file holds the holder's pid, for the message another
// process gets: FAILED_PRECONDITION naming the folder, `what` it is and that
// pid. Creates the folder.
class DirLock {
 public:
  static StatusOr<std::unique_ptr<DirLock>> Acquire(const std::string& dir, const std::string& what);
  ~DirLock();
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

 private:
  explicit DirLock(int fd) : fd_(fd) {}
  int fd_;
};

// rm -rf, best effort.
void RemoveTree(const std::string& path);
// The names in a folder (no "." or ".."); empty when it cannot be read.
std::vector<std::string> ListDir(const std::string& dir);

}  // namespace conveyor
