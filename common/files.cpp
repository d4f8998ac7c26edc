#include "common/files.h"

#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

namespace conveyor {
namespace {

std::string Errno() { return std::strerror(errno); }

Status WriteAll(int fd, std::string_view data, const std::string& path) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return absl::DataLossError("writing " + path + ": " + Errno());
    data.remove_prefix(static_cast<std::size_t>(n));
  }
  return absl::OkStatus();
}

}  // namespace

Status WriteFileDurably(const std::string& path, std::string_view content) {
  return WriteFileDurably(path, std::vector<std::string_view>{content});
}

Status WriteFileDurably(const std::string& path, const std::vector<std::string_view>& pieces) {
  const std::size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  CONVEYOR_RETURN_IF_ERROR(MakeDirs(dir));
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return absl::PermissionDeniedError("cannot write " + tmp + ": " + Errno());
  Status st;
  for (std::string_view piece : pieces) {
    st = WriteAll(fd, piece, tmp);
    if (!st.ok()) break;
  }
  if (st.ok() && ::fsync(fd) != 0) st = absl::DataLossError("fsync of " + tmp + ": " + Errno());
  ::close(fd);
  if (!st.ok()) {
    ::unlink(tmp.c_str());
    return st;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    return absl::PermissionDeniedError("cannot rename " + tmp + " to " + path + ": " + Errno());
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);  // the rename itself survives a power cut
    ::close(dfd);
  }
  return absl::OkStatus();
}

Status MakeDirs(const std::string& dir) {
  struct stat st;
  if (dir.empty() || ::stat(dir.c_str(), &st) == 0) {
    if (dir.empty() || S_ISDIR(st.st_mode)) return absl::OkStatus();
    return absl::PermissionDeniedError("cannot create " + dir + ": a file of that name is in the way");
  }
  const std::size_t slash = dir.rfind('/', dir.size() > 1 ? dir.size() - 2 : 0);
  if (slash != std::string::npos && slash > 0) CONVEYOR_RETURN_IF_ERROR(MakeDirs(dir.substr(0, slash)));
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST)
    return absl::PermissionDeniedError("cannot create " + dir + ": " + Errno());
  return absl::OkStatus();
}

void RemoveTree(const std::string& path) {
  auto remove = [](const char* p, const struct stat*, int, struct FTW*) {
    ::remove(p);  // best effort: go on with the rest
    return 0;
  };
  ::nftw(path.c_str(), remove, 16, FTW_DEPTH | FTW_PHYS);
}

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return names;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(d);
  return names;
}

StatusOr<std::string> ReadWholeFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return absl::NotFoundError("no file " + path);
    return absl::PermissionDeniedError("cannot read " + path + ": " + Errno());
  }
  std::string out;
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd);
      return absl::DataLossError("reading " + path + ": " + Errno());
    }
    if (n == 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return out;
}

StatusOr<std::unique_ptr<DirLock>> DirLock::Acquire(const std::string& dir, const std::string& what) {
  CONVEYOR_RETURN_IF_ERROR(MakeDirs(dir));
  const std::string path = dir + "/LOCK";
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return absl::PermissionDeniedError("cannot open " + path + ": " + Errno());
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const bool held = errno == EWOULDBLOCK;
    const std::string why = Errno();
    char pid[32] = {0};
    const ssize_t n = ::pread(fd, pid, sizeof pid - 1, 0);
    ::close(fd);
    if (!held) return absl::PermissionDeniedError("cannot lock " + path + ": " + why);
    std::string holder = n > 0 ? std::string(pid, static_cast<std::size_t>(n)) : "";
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    return absl::FailedPreconditionError(what + " " + dir + " is in use by another process" +
                                         (holder.empty() ? "" : " (pid " + holder + ")") +
                                         ": two processes must not share it");
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    ::close(fd);
    return absl::PermissionDeniedError("cannot write " + path + ": " + Errno());
  }
  return std::unique_ptr<DirLock>(new DirLock(fd));
}

DirLock::~DirLock() { ::close(fd_); }

Status WriteFileAtomically(const std::string& path, const std::string& content) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) return absl::PermissionDeniedError("cannot write " + tmp);
    out << content;
    out.flush();
    if (!out) return absl::DataLossError("writing " + tmp + " failed");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    return absl::PermissionDeniedError("cannot rename " + tmp + " to " + path);
  return absl::OkStatus();
}

}  // namespace conveyor
