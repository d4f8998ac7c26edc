// TorchFile (torch_file.h): a file mapped, its zip read, its data.pkl
// unpickled, and its tensors' bytes reached within the mapping.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string_view>

#include "torch_format/torch_file.h"
#include "torch_format/zip.h"

namespace conveyor {
namespace {

using torch_format::Crc32;
using torch_format::kLocalSig;
using torch_format::Le;
using torch_format::ReadZip;
using torch_format::ZipEntry;

std::string Errno() { return std::strerror(errno); }

}  // namespace

// The file's bytes: a private mapping (Open) or a string (FromBytes).
class FileBytes {
 public:
  FileBytes(void* map, std::size_t size) : map_(map), data_(static_cast<uint8_t*>(map)), size_(size) {}
  explicit FileBytes(std::string bytes)
      : owned_(std::move(bytes)), data_(reinterpret_cast<uint8_t*>(owned_.data())), size_(owned_.size()) {}
  ~FileBytes() {
    if (map_ != nullptr) ::munmap(map_, size_);
  }
  FileBytes(const FileBytes&) = delete;
  FileBytes& operator=(const FileBytes&) = delete;
  uint8_t* data() const { return data_; }
  std::size_t size() const { return size_; }

 private:
  void* map_ = nullptr;
  std::string owned_;
  uint8_t* data_;
  std::size_t size_;
};

TorchFile::~TorchFile() = default;

StatusOr<std::unique_ptr<TorchFile>> TorchFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return absl::NotFoundError(path + ": no such file");
    return absl::PermissionDeniedError(path + ": cannot open: " + Errno());
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(path + ": not a regular file");
  }
  if (st.st_size == 0) {
    ::close(fd);
    return absl::InvalidArgumentError(path + ": empty file, not a torch.save zip file");
  }
  // Private and writable: tensors made over the mapping may be written to
  // (copy on write); the file never is.
  void* map = ::mmap(nullptr, st.st_size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  const std::string mmap_error = Errno();
  ::close(fd);
  if (map == MAP_FAILED) return absl::ResourceExhaustedError(path + ": cannot map: " + mmap_error);
  return Parse(std::make_shared<FileBytes>(map, static_cast<std::size_t>(st.st_size)), path);
}

StatusOr<std::unique_ptr<TorchFile>> TorchFile::FromBytes(std::string bytes, const std::string& name) {
  return Parse(std::make_shared<FileBytes>(std::move(bytes)), name);
}

StatusOr<std::unique_ptr<TorchFile>> TorchFile::Parse(std::shared_ptr<FileBytes> bytes, const std::string& name) {
  const uint8_t* p = bytes->data();
  const std::size_t size = bytes->size();
  if (size >= 2 && p[0] == 0x80 && p[1] <= 5 && (size < 4 || Le(p, 4) != kLocalSig))
    return absl::InvalidArgumentError(name +
                                      ": PyTorch's legacy format (before 1.6, or "
                                      "_use_new_zipfile_serialization=False); save it again with torch.save");
  if (size >= 6 && std::memcmp(p, "\x93NUMPY", 6) == 0) {
    return absl::InvalidArgumentError(name + ": a NumPy .npy file, not torch.save's; write the arrays as tensors: "
                                             "torch.save({\"inputs\": torch.from_numpy(X), \"targets\": "
                                             "torch.from_numpy(Y)}, FILE)");
  }
  std::map<std::string, ZipEntry> entries;
  CONVEYOR_RETURN_IF_ERROR(ReadZip(p, size, name, &entries));

  auto file = std::unique_ptr<TorchFile>(new TorchFile());
  file->name_ = name;
  file->bytes_ = bytes;
  const ZipEntry* pickle = nullptr;
  for (const auto& [entry, z] : entries) {
    const std::size_t slash = entry.find('/');
    if (slash == std::string::npos || entry.compare(slash, std::string::npos, "/data.pkl") != 0) continue;
    if (pickle != nullptr)
      return absl::InvalidArgumentError(name + ": two archives (" + file->archive_ + " and " +
                                        entry.substr(0, slash) + ")");
    file->archive_ = entry.substr(0, slash);
    pickle = &z;
  }
  if (pickle == nullptr) return absl::InvalidArgumentError(name + ": a zip file without <archive>/data.pkl, not torch.save's");
  const std::string prefix = file->archive_ + "/";
  if (auto it = entries.find(prefix + "byteorder"); it != entries.end()) {
    const std::string order(reinterpret_cast<const char*>(p + it->second.offset), it->second.size);
    if (order != "little")
      return absl::InvalidArgumentError(name + ": byte order '" + order + "' (only little-endian files)");
  }
  const std::string data_prefix = prefix + "data/";
  for (const auto& [entry, z] : entries)
    if (entry.compare(0, data_prefix.size(), data_prefix) == 0)
      file->storages_[entry.substr(data_prefix.size())] = ByteSpan{p + z.offset, static_cast<std::size_t>(z.size)};
  if (Crc32(p + pickle->offset, pickle->size) != pickle->crc)
    return absl::InvalidArgumentError(name + ": data.pkl fails its CRC-32 check (corrupt file)");

  CONVEYOR_ASSIGN_OR_RETURN(
      file->root_,
      UnpickleRestricted(std::string_view(reinterpret_cast<const char*>(p + pickle->offset), pickle->size),
                         file->storages_, name + ": data.pkl"));
  return file;
}

ByteSpan TorchFile::Storage(const std::string& key) const {
  auto it = storages_.find(key);
  return it == storages_.end() ? ByteSpan{} : it->second;
}

uint8_t* TorchFile::MutableData(const ByteSpan& span) const {
  return bytes_->data() + (span.data - bytes_->data());
}

std::string TorchFile::ContiguousBytes(const TensorRef& t) const {
  const ByteSpan storage = Storage(t.storage_key);
  const int64_t elem = TorchDTypeSize(t.dtype);
  const int64_t numel = t.numel();
  std::string out(static_cast<std::size_t>(numel * elem), '\0');
  if (numel == 0) return out;
  const uint8_t* base = storage.data + t.storage_offset * elem;
  if (t.is_contiguous()) {
    std::memcpy(out.data(), base, out.size());
    return out;
  }
  std::vector<int64_t> index(t.shape.size(), 0);
  for (int64_t n = 0; n < numel; ++n) {
    int64_t at = 0;
    for (std::size_t d = 0; d < index.size(); ++d) at += index[d] * t.strides[d];
    std::memcpy(out.data() + n * elem, base + at * elem, elem);
    for (std::size_t d = index.size(); d-- > 0;) {
      if (++index[d] < t.shape[d]) break;
      index[d] = 0;
    }
  }
  return out;
}

StatusOr<std::vector<std::pair<std::string, TensorRef>>> TorchFile::TensorEntries() const {
  if (root_.kind != PickleValue::Kind::kDict)
    return absl::InvalidArgumentError(name_ + ": holds a " + root_.TypeName() + ", not a dict of tensors");
  std::vector<std::pair<std::string, TensorRef>> out;
  for (std::size_t n = 0; n < root_.keys.size(); ++n) {
    const PickleValue& key = root_.keys[n];
    if (key.kind != PickleValue::Kind::kString)
      return absl::InvalidArgumentError(name_ + ": a key of type " + key.TypeName() + " (a state_dict's are str)");
    if (root_.items[n].kind != PickleValue::Kind::kTensor)
      return absl::InvalidArgumentError(name_ + ": '" + key.s + "' is a " + root_.items[n].TypeName() +
                                        ", not a tensor");
    out.emplace_back(key.s, root_.items[n].tensor);
  }
  return out;
}

}  // namespace conveyor
