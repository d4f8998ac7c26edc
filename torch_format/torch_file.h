// PyTorch's files without LibTorch: a restricted reader and a writer of the zip
// format that torch.save writes (state_dicts, and the `format: tensors` data
// files {"inputs": X, "targets": Y}).
//
// The reader accepts only what torch.load(path, weights_only=True) accepts, and
// less: None, bools, ints (64-bit), floats, str, bytes, tuples, lists, dicts,
// collections.OrderedDict (its BUILD of `_metadata` is parsed and dropped),
// tensors (torch._utils._rebuild_tensor_v2, _rebuild_tensor, _rebuild_parameter)
// over storages named by persistent ids ('storage', torch.<T>Storage, key,
// location, numel), torch.device and torch.Size. Any other global (os.system,
// builtins.eval, a user's class) is refused with INVALID_ARGUMENT naming it, and
// nothing is ever imported or called: the unpickler builds values only.
//
// Tensor data is not copied: the file is mapped (mmap, MAP_PRIVATE) and
// storages are spans of the mapping. Every bound is checked (zip records,
// pickle opcodes, each tensor's extent within its storage), so a truncated or
// corrupt file gives INVALID_ARGUMENT with the file's name, never a crash. A
// file that another process truncates while mapped can still raise SIGBUS:
// WriteTorchFile replaces files by rename, never in place.
//
// Thread-safety: a TorchFile is immutable after Open; share it freely.
//
// The room (torch_format/): this header is its public API; zip.h (the zip
// archive, read and written), layout.h (element types and strided views),
// unpickler.cpp (the restricted pickle machine), torch_file.cpp (opening and
// reading a file) and torch_file_writer.cpp (torch.save's layout, written)
// are its parts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace conveyor {

// The element types a torch file may hold (the proto's v1::DType lacks the
// integer and bool types that buffers and data files use).
enum class TorchDType { kFloat32, kFloat64, kFloat16, kBFloat16, kInt64, kInt32, kInt16, kInt8, kUInt8, kBool };

int64_t TorchDTypeSize(TorchDType dtype);
// "float32", "bfloat16", ... (torch's names without "torch.").
std::string TorchDTypeName(TorchDType dtype);
// torch.FloatStorage's "FloatStorage" for float32, ...
std::string TorchStorageName(TorchDType dtype);

// A tensor as the pickle describes it: a strided view of a storage.
struct TensorRef {
  TorchDType dtype = TorchDType::kFloat32;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // in elements
  int64_t storage_offset = 0;    // in elements
  std::string storage_key;       // the entry <archive>/data/<key>
  std::string location;          // where it was saved from: "cpu", "cuda:0"
  bool requires_grad = false;

  int64_t numel() const;
  bool is_contiguous() const;
};

// One unpickled value. Containers own their children (a tree: what the
// pickle shared through its memo is copied, bounded in size and depth).
struct PickleValue {
  enum class Kind { kNone, kBool, kInt, kFloat, kString, kBytes, kList, kTuple, kDict, kTensor };
  Kind kind = Kind::kNone;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;                   // kString (UTF-8 as written) and kBytes
  std::vector<PickleValue> items;  // kList, kTuple; kDict: the values
  std::vector<PickleValue> keys;   // kDict: keys[n] -> items[n] (str or int), in insertion order
  bool ordered = false;            // kDict: a collections.OrderedDict
  TensorRef tensor;                // kTensor

  // kDict only: the value under string key `key`, or nullptr.
  const PickleValue* Find(const std::string& key) const;
  // "dict", "OrderedDict", "tensor", "str", ...
  std::string TypeName() const;
};

// A storage's bytes inside the mapping (or inside the buffer of FromBytes).
struct ByteSpan {
  const uint8_t* data = nullptr;
  std::size_t size = 0;
};

// The restricted unpickler alone, over a data.pkl's bytes: `storages` are the
// zip's data/<key> entries that persistent ids may name (each id's numel and
// dtype must match its entry's size). Errors start with `where`.
StatusOr<PickleValue> UnpickleRestricted(std::string_view pickle, const std::map<std::string, ByteSpan>& storages,
                                         const std::string& where);

// Keeps the bytes of a file alive (munmap or free on destruction).
class FileBytes;

class TorchFile {
 public:
  // Maps and parses `path`. NOT_FOUND when it does not exist, INVALID_ARGUMENT
  // when it is not a torch.save zip file this reader accepts (the message
  // starts with the path and names what is wrong).
  static StatusOr<std::unique_ptr<TorchFile>> Open(const std::string& path);
  // The same over bytes in memory; `name` stands for the path in messages.
  static StatusOr<std::unique_ptr<TorchFile>> FromBytes(std::string bytes, const std::string& name);

  ~TorchFile();
  TorchFile(const TorchFile&) = delete;
  TorchFile& operator=(const TorchFile&) = delete;

  const std::string& name() const { return name_; }
  // The folder name before /data.pkl (torch.save uses the file's stem in 1.x,
  // "archive" in 2.x).
  const std::string& archive() const { return archive_; }
  const PickleValue& root() const { return root_; }

  // The bytes of storage `key` (every key a tensor names is present: Open
  // checked it, and that each tensor's extent fits its storage).
  ByteSpan Storage(const std::string& key) const;
  // Holds the bytes that Storage() points into; a LibTorch tensor made over
  // them keeps this alive in its deleter. The mapping is MAP_PRIVATE and
  // writable: writes to it stay in this process (copy on write), the file is
  // never changed.
  std::shared_ptr<FileBytes> bytes() const { return bytes_; }
  uint8_t* MutableData(const ByteSpan& span) const;

  // A tensor's elements in row-major order (a copy; strides followed).
  std::string ContiguousBytes(const TensorRef& t) const;
  // The root as a dict of tensors, in file order: a state_dict. Refuses
  // (INVALID_ARGUMENT, naming the key) a root that is not a dict with string
  // keys and tensor values.
  StatusOr<std::vector<std::pair<std::string, TensorRef>>> TensorEntries() const;

 private:
  TorchFile() = default;
  static StatusOr<std::unique_ptr<TorchFile>> Parse(std::shared_ptr<FileBytes> bytes, const std::string& name);

  std::string name_;
  std::string archive_;
  std::shared_ptr<FileBytes> bytes_;
  std::map<std::string, ByteSpan> storages_;  // key -> span (data/<key> entries)
  PickleValue root_;
};

// A tensor to write: its bytes in `data` (little-endian, as in memory),
// viewed with `shape` and `strides` (empty: contiguous). Every element the
// view reaches must lie within [data, data + nbytes); nbytes must be a
// multiple of the element size. `data` must stay valid during the write.
struct TensorRecord {
  TorchDType dtype = TorchDType::kFloat32;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  const void* data = nullptr;
  std::size_t nbytes = 0;
  bool requires_grad = false;
};

struct TorchWriteOptions {
  // collections.OrderedDict (what state_dict() returns) or a plain dict.
  bool ordered_dict = true;
  // The folder inside the zip; any name torch.load accepts.
  std::string archive = "archive";
  // Zip64 records for every entry even when none is over 4 GiB (tests use it
  // to exercise the zip64 path on small files); they are used where needed
  // regardless.
  bool force_zip64 = false;
};

// Writes {name: tensor, ...} in the layout torch.save uses (protocol-2 pickle
// in <archive>/data.pkl, one stored, uncompressed entry <archive>/data/<n> per
// tensor with its data aligned to 64 bytes, <archive>/byteorder "little",
// <archive>/version "3"), readable by torch.load(weights_only=True) in
// PyTorch 1.13 and 2.x. Replaces `path` atomically (temp file, fsync, rename).
// INVALID_ARGUMENT for a record whose view does not fit its bytes.
Status WriteTorchFile(const std::string& path, const std::vector<std::pair<std::string, TensorRecord>>& tensors,
                      const TorchWriteOptions& options = {});
// A state_dict: WriteTorchFile with an OrderedDict.
Status WriteStateDict(const std::string& path, const std::vector<std::pair<std::string, TensorRecord>>& tensors);

}  // namespace conveyor
