#include "common/torch_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <string_view>
#include <unordered_map>

#include "common/files.h"

namespace conveyor {

// ---------------------------------------------------------------- dtypes ---

namespace {

struct DTypeInfo {
  TorchDType dtype;
  int64_t size;
  const char* name;
  const char* storage;
};

constexpr DTypeInfo kDTypes[] = {
    {TorchDType::kFloat32, 4, "float32", "FloatStorage"},   {TorchDType::kFloat64, 8, "float64", "DoubleStorage"},
    {TorchDType::kFloat16, 2, "float16", "HalfStorage"},    {TorchDType::kBFloat16, 2, "bfloat16", "BFloat16Storage"},
    {TorchDType::kInt64, 8, "int64", "LongStorage"},        {TorchDType::kInt32, 4, "int32", "IntStorage"},
    {TorchDType::kInt16, 2, "int16", "ShortStorage"},       {TorchDType::kInt8, 1, "int8", "CharStorage"},
    {TorchDType::kUInt8, 1, "uint8", "ByteStorage"},        {TorchDType::kBool, 1, "bool", "BoolStorage"},
};

const DTypeInfo& Info(TorchDType dtype) {
  for (const auto& info : kDTypes)
    if (info.dtype == dtype) return info;
  return kDTypes[0];  // unreachable for valid enumerators
}

bool MulOverflow(int64_t a, int64_t b, int64_t* out) { return __builtin_mul_overflow(a, b, out); }
bool AddOverflow(int64_t a, int64_t b, int64_t* out) { return __builtin_add_overflow(a, b, out); }

// The number of elements a view reaches past its offset: 1 + sum((n-1)*s),
// or 0 for an empty view; false on overflow or a negative size/stride.
bool ViewExtent(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides, int64_t* extent) {
  int64_t last = 0;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] < 0 || strides[d] < 0) return false;
    if (shape[d] == 0) {
      *extent = 0;
      return true;
    }
    int64_t step;
    if (MulOverflow(shape[d] - 1, strides[d], &step) || AddOverflow(last, step, &last)) return false;
  }
  return !AddOverflow(last, 1, extent);
}

std::vector<int64_t> ContiguousStrides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size());
  int64_t s = 1;
  for (std::size_t d = shape.size(); d-- > 0;) {
    strides[d] = s;
    s *= shape[d] > 1 ? shape[d] : 1;
  }
  return strides;
}

std::string Errno() { return std::strerror(errno); }

uint64_t Le(const uint8_t* p, int n) {
  uint64_t v = 0;
  for (int k = n - 1; k >= 0; --k) v = (v << 8) | p[k];
  return v;
}

uint32_t Crc32(const uint8_t* p, std::size_t n) {
  uLong crc = crc32(0L, Z_NULL, 0);
  while (n > 0) {
    const uInt chunk = n > (1u << 30) ? (1u << 30) : static_cast<uInt>(n);
    crc = crc32(crc, p, chunk);
    p += chunk;
    n -= chunk;
  }
  return static_cast<uint32_t>(crc);
}

}  // namespace

int64_t TorchDTypeSize(TorchDType dtype) { return Info(dtype).size; }
std::string TorchDTypeName(TorchDType dtype) { return Info(dtype).name; }
std::string TorchStorageName(TorchDType dtype) { return Info(dtype).storage; }

int64_t TensorRef::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

bool TensorRef::is_contiguous() const {
  const std::vector<int64_t> want = ContiguousStrides(shape);
  for (std::size_t d = 0; d < shape.size(); ++d)
    if (shape[d] > 1 && strides[d] != want[d]) return false;
  return true;
}

const PickleValue* PickleValue::Find(const std::string& key) const {
  if (kind != Kind::kDict) return nullptr;
  for (std::size_t n = 0; n < keys.size(); ++n)
    if (keys[n].kind == Kind::kString && keys[n].s == key) return &items[n];
  return nullptr;
}

std::string PickleValue::TypeName() const {
  switch (kind) {
    case Kind::kNone: return "None";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kBytes: return "bytes";
    case Kind::kList: return "list";
    case Kind::kTuple: return "tuple";
    case Kind::kDict: return ordered ? "OrderedDict" : "dict";
    case Kind::kTensor: return "tensor";
  }
  return "?";
}

// ------------------------------------------------------------ file bytes ---

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

// ------------------------------------------------------------------- zip ---

namespace {

struct ZipEntry {
  uint64_t offset = 0;  // of the data
  uint64_t size = 0;
  uint32_t crc = 0;
};

constexpr uint32_t kLocalSig = 0x04034b50, kCentralSig = 0x02014b50, kEndSig = 0x06054b50;
constexpr uint32_t kEnd64Sig = 0x06064b50, kLocator64Sig = 0x07064b50;

// Reads the central directory: name -> stored entry. Every offset is checked
// against the file's size.
Status ReadZip(const uint8_t* p, uint64_t size, const std::string& name, std::map<std::string, ZipEntry>* out) {
  auto bad = [&](const std::string& what) { return absl::InvalidArgumentError(name + ": " + what); };
  if (size < 22) return bad("not a zip file (" + std::to_string(size) + " bytes, too short for one)");
  uint64_t eocd = UINT64_MAX;
  const uint64_t lowest = size >= 22 + 65535 ? size - 22 - 65535 : 0;
  for (uint64_t at = size - 22 + 1; at-- > lowest;) {
    if (Le(p + at, 4) == kEndSig && at + 22 + Le(p + at + 20, 2) == size) {
      eocd = at;
      break;
    }
  }
  if (eocd == UINT64_MAX) return bad("not a zip file, or a truncated one (no end of central directory record)");
  uint64_t entries = Le(p + eocd + 10, 2), cd_size = Le(p + eocd + 12, 4), cd_offset = Le(p + eocd + 16, 4);
  if (eocd >= 20 && Le(p + eocd - 20, 4) == kLocator64Sig) {
    const uint64_t end64 = Le(p + eocd - 20 + 8, 8);
    if (end64 > eocd - 20 || eocd - 20 - end64 < 56 || Le(p + end64, 4) != kEnd64Sig)
      return bad("corrupt zip64 end of central directory record");
    entries = Le(p + end64 + 32, 8);
    cd_size = Le(p + end64 + 40, 8);
    cd_offset = Le(p + end64 + 48, 8);
  }
  if (cd_offset > size || cd_size > size - cd_offset) return bad("corrupt zip central directory (past the end)");
  if (entries > cd_size / 46) return bad("corrupt zip central directory (" + std::to_string(entries) + " entries)");
  uint64_t at = cd_offset;
  const uint64_t cd_end = cd_offset + cd_size;
  for (uint64_t n = 0; n < entries; ++n) {
    if (cd_end - at < 46 || Le(p + at, 4) != kCentralSig) return bad("corrupt zip central directory entry");
    const uint64_t flags = Le(p + at + 8, 2), method = Le(p + at + 10, 2);
    const uint32_t crc = static_cast<uint32_t>(Le(p + at + 16, 4));
    uint64_t csize = Le(p + at + 20, 4), usize = Le(p + at + 24, 4);
    const uint64_t name_len = Le(p + at + 28, 2), extra_len = Le(p + at + 30, 2), comment_len = Le(p + at + 32, 2);
    uint64_t local = Le(p + at + 42, 4);
    if (cd_end - at - 46 < name_len + extra_len + comment_len) return bad("corrupt zip central directory entry");
    const std::string entry(reinterpret_cast<const char*>(p + at + 46), name_len);
    // Zip64 sizes and offset: present for each field that reads 0xFFFFFFFF.
    const uint8_t* extra = p + at + 46 + name_len;
    for (uint64_t e = 0; e + 4 <= extra_len;) {
      const uint64_t id = Le(extra + e, 2), len = Le(extra + e + 2, 2);
      if (e + 4 + len > extra_len) return bad("corrupt zip extra field in " + entry);
      if (id == 1) {
        uint64_t f = e + 4;
        auto take = [&](uint64_t* field) {
          if (*field != 0xFFFFFFFFu) return true;
          if (f + 8 > e + 4 + len) return false;
          *field = Le(extra + f, 8);
          f += 8;
          return true;
        };
        if (!take(&usize) || !take(&csize) || !take(&local)) return bad("corrupt zip64 extra field in " + entry);
      }
      e += 4 + len;
    }
    if (flags & 1) return bad(entry + " is encrypted");
    if (method != 0)
      return bad(entry + " is compressed (method " + std::to_string(method) +
                 "); torch.save stores entries uncompressed");
    if (csize != usize) return bad("corrupt zip entry " + entry + " (stored sizes differ)");
    if (local > size || size - local < 30 || Le(p + local, 4) != kLocalSig)
      return bad("corrupt zip local header of " + entry);
    const uint64_t data = local + 30 + Le(p + local + 26, 2) + Le(p + local + 28, 2);
    if (data > size || usize > size - data)
      return bad(entry + " runs past the end of the file (truncated?)");
    (*out)[entry] = ZipEntry{data, usize, crc};
    at += 46 + name_len + extra_len + comment_len;
  }
  return absl::OkStatus();
}

// ------------------------------------------------------------- unpickler ---

enum class Callable { kOrderedDict, kRebuildTensorV2, kRebuildTensor, kRebuildParameter, kStorageType, kDevice, kSize };

// What the pickle builds, by reference as in Python (the memo shares nodes);
// converted to a tree of PickleValue at STOP.
struct Node {
  enum Kind { kValue, kList, kTuple, kDict, kTensor, kCallable, kStorage } kind = kValue;
  PickleValue scalar;           // kValue: none, bool, int, float, str, bytes
  std::vector<int> items;       // kList, kTuple, kDict (values)
  std::vector<int> keys;        // kDict
  std::unordered_map<std::string, std::size_t> index;  // kDict: key -> position
  bool ordered = false;
  TensorRef tensor;             // kTensor
  Callable callable = Callable::kOrderedDict;  // kCallable
  std::string callable_name;
  TorchDType dtype = TorchDType::kUInt8;  // kCallable (a storage type), kStorage
  std::string key, location;              // kStorage
  int64_t numel = 0;                      // kStorage
};

class Unpickler {
 public:
  Unpickler(const uint8_t* p, std::size_t n, std::string where, const std::map<std::string, ByteSpan>& storages)
      : p_(p), n_(n), where_(std::move(where)), storages_(storages) {}

  StatusOr<PickleValue> Load() {
    while (true) {
      if (pos_ >= n_) return Bad("ends without STOP (truncated?)");
      op_at_ = pos_;
      const uint8_t op = p_[pos_++];
      if (op == '.') {
        if (Avail() != 1 || !marks_.empty()) return Bad("STOP with " + std::to_string(stack_.size()) + " values left");
        int64_t budget = 4 * static_cast<int64_t>(nodes_.size()) + 1024;
        return Convert(stack_.back(), 0, &budget);
      }
      CONVEYOR_RETURN_IF_ERROR(Step(op));
    }
  }

 private:
  Status Bad(const std::string& what) const {
    return absl::InvalidArgumentError(where_ + ": " + what + " (at byte " + std::to_string(op_at_) + ")");
  }
  Status Refuse(const std::string& what) const {
    return absl::InvalidArgumentError(where_ + ": refuses to call " + what +
                                      " (only what torch.load(weights_only=True) accepts)");
  }

  bool Read(std::size_t k, const uint8_t** out) {
    if (k > n_ - pos_) return false;
    *out = p_ + pos_;
    pos_ += k;
    return true;
  }
  Status ReadLe(int k, uint64_t* v) {
    const uint8_t* q;
    if (!Read(k, &q)) return Bad("truncated pickle");
    *v = Le(q, k);
    return absl::OkStatus();
  }
  Status ReadLine(std::string* line) {
    const void* nl = std::memchr(p_ + pos_, '\n', std::min<std::size_t>(n_ - pos_, 1024));
    if (nl == nullptr) return Bad("GLOBAL without a name line");
    const std::size_t end = static_cast<const uint8_t*>(nl) - p_;
    line->assign(reinterpret_cast<const char*>(p_ + pos_), end - pos_);
    pos_ = end + 1;
    return absl::OkStatus();
  }

  std::size_t Base() const { return marks_.empty() ? 0 : marks_.back(); }
  std::size_t Avail() const { return stack_.size() - Base(); }
  Status Need(std::size_t k) const {
    if (Avail() < k) return Bad("pickle stack underflow");
    return absl::OkStatus();
  }
  int Top() const { return stack_.back(); }
  int Pop() {
    const int v = stack_.back();
    stack_.pop_back();
    return v;
  }
  StatusOr<std::vector<int>> PopMark() {
    if (marks_.empty()) return Bad("no MARK to pop to");
    std::vector<int> items(stack_.begin() + marks_.back(), stack_.end());
    stack_.resize(marks_.back());
    marks_.pop_back();
    return items;
  }
  int New(Node node) {
    nodes_.push_back(std::move(node));
    return static_cast<int>(nodes_.size() - 1);
  }
  void PushValue(PickleValue v) {
    Node node;
    node.scalar = std::move(v);
    stack_.push_back(New(std::move(node)));
  }
  void PushInt(int64_t i) {
    PickleValue v;
    v.kind = PickleValue::Kind::kInt;
    v.i = i;
    PushValue(std::move(v));
  }
  Status PushString(std::size_t len, PickleValue::Kind kind) {
    const uint8_t* q;
    if (!Read(len, &q)) return Bad("truncated pickle (a string of " + std::to_string(len) + " bytes)");
    PickleValue v;
    v.kind = kind;
    v.s.assign(reinterpret_cast<const char*>(q), len);
    PushValue(std::move(v));
    return absl::OkStatus();
  }
  int PushContainer(Node::Kind kind, std::vector<int> items) {
    Node node;
    node.kind = kind;
    node.items = std::move(items);
    const int id = New(std::move(node));
    stack_.push_back(id);
    return id;
  }

  bool IsScalar(int id, PickleValue::Kind kind) const {
    return nodes_[id].kind == Node::kValue && nodes_[id].scalar.kind == kind;
  }
  std::string Describe(int id) const {
    switch (nodes_[id].kind) {
      case Node::kValue: return nodes_[id].scalar.TypeName();
      case Node::kList: return "list";
      case Node::kTuple: return "tuple";
      case Node::kDict: return nodes_[id].ordered ? "OrderedDict" : "dict";
      case Node::kTensor: return "tensor";
      case Node::kCallable: return nodes_[id].callable_name;
      case Node::kStorage: return "storage";
    }
    return "?";
  }

  Status SetItem(int dict, int key, int value) {
    if (nodes_[dict].kind != Node::kDict) return Bad("SETITEM on a " + Describe(dict));
    std::string k;
    if (IsScalar(key, PickleValue::Kind::kString))
      k = "s" + nodes_[key].scalar.s;
    else if (IsScalar(key, PickleValue::Kind::kInt))
      k = "i" + std::to_string(nodes_[key].scalar.i);
    else
      return Bad("a dict key of type " + Describe(key) + " (only str and int keys)");
    Node& d = nodes_[dict];
    auto [it, inserted] = d.index.emplace(std::move(k), d.items.size());
    if (inserted) {
      d.keys.push_back(key);
      d.items.push_back(value);
    } else {
      d.items[it->second] = value;  // as Python: the first position, the last value
    }
    return absl::OkStatus();
  }

  Status Global(const std::string& module, const std::string& name) {
    const std::string full = module + "." + name;
    Node node;
    node.kind = Node::kCallable;
    node.callable_name = full;
    if (full == "collections.OrderedDict") {
      node.callable = Callable::kOrderedDict;
    } else if (full == "torch._utils._rebuild_tensor_v2") {
      node.callable = Callable::kRebuildTensorV2;
    } else if (full == "torch._utils._rebuild_tensor") {
      node.callable = Callable::kRebuildTensor;
    } else if (full == "torch._utils._rebuild_parameter") {
      node.callable = Callable::kRebuildParameter;
    } else if (full == "torch.device") {
      node.callable = Callable::kDevice;
    } else if (full == "torch.Size") {
      node.callable = Callable::kSize;
    } else if (full == "torch.UntypedStorage" || full == "torch.storage.UntypedStorage" ||
               full == "torch.storage._UntypedStorage") {
      node.callable = Callable::kStorageType;
      node.dtype = TorchDType::kUInt8;
    } else {
      bool found = false;
      if (module == "torch")
        for (const auto& info : kDTypes)
          if (name == info.storage) {
            node.callable = Callable::kStorageType;
            node.dtype = info.dtype;
            found = true;
          }
      if (!found) return Refuse(full);
    }
    stack_.push_back(New(std::move(node)));
    return absl::OkStatus();
  }

  StatusOr<std::vector<int64_t>> Ints(int id, const char* what) const {
    if (nodes_[id].kind != Node::kTuple && nodes_[id].kind != Node::kList)
      return Bad(std::string("a tensor's ") + what + " is a " + Describe(id) + ", not a tuple");
    std::vector<int64_t> out;
    for (int item : nodes_[id].items) {
      if (!IsScalar(item, PickleValue::Kind::kInt))
        return Bad(std::string("a tensor's ") + what + " holds a " + Describe(item));
      out.push_back(nodes_[item].scalar.i);
    }
    return out;
  }

  // _rebuild_tensor(storage, offset, size, stride) and the v2 form's extra
  // (requires_grad, backward_hooks[, metadata]).
  Status RebuildTensor(const std::vector<int>& args, bool v2) {
    if (v2 ? (args.size() != 6 && args.size() != 7) : args.size() != 4)
      return Bad(std::string(v2 ? "_rebuild_tensor_v2" : "_rebuild_tensor") + " with " +
                 std::to_string(args.size()) + " arguments");
    const Node& storage = nodes_[args[0]];
    if (storage.kind != Node::kStorage) return Bad("a tensor over a " + Describe(args[0]) + ", not a storage");
    if (!IsScalar(args[1], PickleValue::Kind::kInt)) return Bad("a tensor's storage offset is a " + Describe(args[1]));
    TensorRef t;
    t.dtype = storage.dtype;
    t.storage_key = storage.key;
    t.location = storage.location;
    t.storage_offset = nodes_[args[1]].scalar.i;
    CONVEYOR_ASSIGN_OR_RETURN(t.shape, Ints(args[2], "size"));
    CONVEYOR_ASSIGN_OR_RETURN(t.strides, Ints(args[3], "stride"));
    if (v2) {
      if (!IsScalar(args[4], PickleValue::Kind::kBool)) return Bad("a tensor's requires_grad is a " + Describe(args[4]));
      t.requires_grad = nodes_[args[4]].scalar.b;
    }
    if (t.shape.size() != t.strides.size())
      return Bad("tensor of storage " + t.storage_key + " has " + std::to_string(t.shape.size()) + " sizes but " +
                 std::to_string(t.strides.size()) + " strides");
    int64_t extent, end;
    if (t.storage_offset < 0 || !ViewExtent(t.shape, t.strides, &extent) ||
        AddOverflow(t.storage_offset, extent, &end))
      return Bad("tensor of storage " + t.storage_key + " has a negative or overflowing size, stride or offset");
    if (extent > 0 && end > storage.numel)
      return Bad("tensor of storage " + t.storage_key + " reaches element " + std::to_string(end) +
                 " of a storage of " + std::to_string(storage.numel));
    Node node;
    node.kind = Node::kTensor;
    node.tensor = std::move(t);
    stack_.push_back(New(std::move(node)));
    return absl::OkStatus();
  }

  Status Reduce() {
    CONVEYOR_RETURN_IF_ERROR(Need(2));
    const int args_id = Pop();
    const int fn_id = Pop();
    if (nodes_[fn_id].kind != Node::kCallable) return Bad("REDUCE of a " + Describe(fn_id));
    if (nodes_[args_id].kind != Node::kTuple) return Bad("REDUCE with arguments in a " + Describe(args_id));
    const std::vector<int> args = nodes_[args_id].items;
    const Node& fn = nodes_[fn_id];
    switch (fn.callable) {
      case Callable::kOrderedDict: {
        if (!args.empty()) return Bad("collections.OrderedDict with arguments");
        const int id = PushContainer(Node::kDict, {});
        nodes_[id].ordered = true;
        return absl::OkStatus();
      }
      case Callable::kRebuildTensorV2: return RebuildTensor(args, true);
      case Callable::kRebuildTensor: return RebuildTensor(args, false);
      case Callable::kRebuildParameter: {
        if (args.size() != 3 || nodes_[args[0]].kind != Node::kTensor || !IsScalar(args[1], PickleValue::Kind::kBool))
          return Bad("_rebuild_parameter without (tensor, requires_grad, hooks)");
        Node node = nodes_[args[0]];
        node.tensor.requires_grad = nodes_[args[1]].scalar.b;
        stack_.push_back(New(std::move(node)));
        return absl::OkStatus();
      }
      case Callable::kDevice: {
        if (args.empty() || args.size() > 2 || !IsScalar(args[0], PickleValue::Kind::kString) ||
            (args.size() == 2 && !IsScalar(args[1], PickleValue::Kind::kInt)))
          return Bad("torch.device without (type[, index])");
        PickleValue v = nodes_[args[0]].scalar;
        if (args.size() == 2) v.s += ":" + std::to_string(nodes_[args[1]].scalar.i);
        PushValue(std::move(v));
        return absl::OkStatus();
      }
      case Callable::kSize: {
        if (args.size() != 1) return Bad("torch.Size without one tuple");
        CONVEYOR_ASSIGN_OR_RETURN(std::vector<int64_t> dims, Ints(args[0], "size"));
        (void)dims;
        PushContainer(Node::kTuple, nodes_[args[0]].items);
        return absl::OkStatus();
      }
      case Callable::kStorageType: return Refuse(fn.callable_name + "(...) outside a persistent id");
    }
    return Bad("REDUCE");
  }

  // ('storage', torch.<T>Storage, key, location, numel)
  Status PersistentLoad() {
    CONVEYOR_RETURN_IF_ERROR(Need(1));
    const int pid = Pop();
    const Node& t = nodes_[pid];
    if (t.kind != Node::kTuple || t.items.empty()) return Bad("a persistent id that is a " + Describe(pid));
    const int tag = t.items[0];
    const bool is_storage = (IsScalar(tag, PickleValue::Kind::kString) || IsScalar(tag, PickleValue::Kind::kBytes)) &&
                            nodes_[tag].scalar.s == "storage";
    if (!is_storage) return Bad("a persistent id that is not ('storage', ...)");
    if (t.items.size() != 5 || nodes_[t.items[1]].kind != Node::kCallable ||
        nodes_[t.items[1]].callable != Callable::kStorageType || !IsScalar(t.items[2], PickleValue::Kind::kString) ||
        !IsScalar(t.items[3], PickleValue::Kind::kString) || !IsScalar(t.items[4], PickleValue::Kind::kInt))
      return Bad("a storage id not of the form ('storage', torch.<T>Storage, key, location, numel)");
    Node node;
    node.kind = Node::kStorage;
    node.dtype = nodes_[t.items[1]].dtype;
    node.key = nodes_[t.items[2]].scalar.s;
    node.location = nodes_[t.items[3]].scalar.s;
    node.numel = nodes_[t.items[4]].scalar.i;
    auto it = storages_.find(node.key);
    if (it == storages_.end()) return Bad("storage " + node.key + " has no entry data/" + node.key + " in the zip");
    int64_t bytes;
    if (node.numel < 0 || MulOverflow(node.numel, TorchDTypeSize(node.dtype), &bytes) ||
        static_cast<uint64_t>(bytes) != it->second.size)
      return Bad("storage " + node.key + " of " + std::to_string(node.numel) + " " + TorchDTypeName(node.dtype) +
                 " elements has " + std::to_string(it->second.size) + " bytes in the zip");
    stack_.push_back(New(std::move(node)));
    return absl::OkStatus();
  }

  Status Memo(uint64_t index) {
    CONVEYOR_RETURN_IF_ERROR(Need(1));
    memo_[index] = Top();
    return absl::OkStatus();
  }
  Status Get(uint64_t index) {
    auto it = memo_.find(index);
    if (it == memo_.end()) return Bad("memo " + std::to_string(index) + " read before it was written");
    stack_.push_back(it->second);
    return absl::OkStatus();
  }

  Status Step(uint8_t op) {
    using K = PickleValue::Kind;
    uint64_t v = 0;
    switch (op) {
      case 0x80:  // PROTO
        CONVEYOR_RETURN_IF_ERROR(ReadLe(1, &v));
        if (v < 2 || v > 5) return Bad("pickle protocol " + std::to_string(v));
        return absl::OkStatus();
      case 0x95:  // FRAME: a length hint only
        return ReadLe(8, &v);
      case '(': marks_.push_back(stack_.size()); return absl::OkStatus();
      case '0':  // POP
        if (Avail() > 0) {
          Pop();
        } else if (!marks_.empty()) {
          marks_.pop_back();
        } else {
          return Bad("POP of an empty stack");
        }
        return absl::OkStatus();
      case '1': return PopMark().status();  // POP_MARK
      case '2':                             // DUP
        CONVEYOR_RETURN_IF_ERROR(Need(1));
        stack_.push_back(Top());
        return absl::OkStatus();
      case 'N': PushValue(PickleValue()); return absl::OkStatus();
      case 0x88:
      case 0x89: {
        PickleValue b;
        b.kind = K::kBool;
        b.b = op == 0x88;
        PushValue(std::move(b));
        return absl::OkStatus();
      }
      case 'J':
        CONVEYOR_RETURN_IF_ERROR(ReadLe(4, &v));
        PushInt(static_cast<int32_t>(static_cast<uint32_t>(v)));
        return absl::OkStatus();
      case 'K': CONVEYOR_RETURN_IF_ERROR(ReadLe(1, &v)); PushInt(static_cast<int64_t>(v)); return absl::OkStatus();
      case 'M': CONVEYOR_RETURN_IF_ERROR(ReadLe(2, &v)); PushInt(static_cast<int64_t>(v)); return absl::OkStatus();
      case 0x8a:    // LONG1
      case 0x8b: {  // LONG4
        CONVEYOR_RETURN_IF_ERROR(ReadLe(op == 0x8a ? 1 : 4, &v));
        if (v > 8) return Bad("an integer of " + std::to_string(v) + " bytes (wider than 64 bits)");
        const uint8_t* q;
        if (!Read(v, &q)) return Bad("truncated pickle");
        uint64_t u = v == 0 ? 0 : Le(q, static_cast<int>(v));
        if (v > 0 && v < 8 && (q[v - 1] & 0x80)) u |= ~uint64_t{0} << (8 * v);  // sign-extend
        PushInt(static_cast<int64_t>(u));
        return absl::OkStatus();
      }
      case 'G': {  // BINFLOAT, big-endian
        const uint8_t* q;
        if (!Read(8, &q)) return Bad("truncated pickle");
        uint64_t bits = 0;
        for (int k = 0; k < 8; ++k) bits = (bits << 8) | q[k];
        PickleValue f;
        f.kind = K::kFloat;
        std::memcpy(&f.f, &bits, 8);
        PushValue(std::move(f));
        return absl::OkStatus();
      }
      case 'X': CONVEYOR_RETURN_IF_ERROR(ReadLe(4, &v)); return PushString(v, K::kString);
      case 0x8c: CONVEYOR_RETURN_IF_ERROR(ReadLe(1, &v)); return PushString(v, K::kString);
      case 0x8d: CONVEYOR_RETURN_IF_ERROR(ReadLe(8, &v)); return PushString(v, K::kString);
      case 'U': CONVEYOR_RETURN_IF_ERROR(ReadLe(1, &v)); return PushString(v, K::kString);
      case 'T':
        CONVEYOR_RETURN_IF_ERROR(ReadLe(4, &v));
        if (v & 0x80000000u) return Bad("a string of negative length");
        return PushString(v, K::kString);
      case 'B': CONVEYOR_RETURN_IF_ERROR(ReadLe(4, &v)); return PushString(v, K::kBytes);
      case 'C': CONVEYOR_RETURN_IF_ERROR(ReadLe(1, &v)); return PushString(v, K::kBytes);
      case 0x8e: CONVEYOR_RETURN_IF_ERROR(ReadLe(8, &v)); return PushString(v, K::kBytes);
      case ')': PushContainer(Node::kTuple, {}); return absl::OkStatus();
      case 't': {
        CONVEYOR_ASSIGN_OR_RETURN(std::vector<int> items, PopMark());
        PushContainer(Node::kTuple, std::move(items));
        return absl::OkStatus();
      }
      case 0x85:
      case 0x86:
      case 0x87: {
        const std::size_t k = op - 0x84;
        CONVEYOR_RETURN_IF_ERROR(Need(k));
        std::vector<int> items(stack_.end() - k, stack_.end());
        stack_.resize(stack_.size() - k);
        PushContainer(Node::kTuple, std::move(items));
        return absl::OkStatus();
      }
      case ']': PushContainer(Node::kList, {}); return absl::OkStatus();
      case 'l': {
        CONVEYOR_ASSIGN_OR_RETURN(std::vector<int> items, PopMark());
        PushContainer(Node::kList, std::move(items));
        return absl::OkStatus();
      }
      case 'a': {
        CONVEYOR_RETURN_IF_ERROR(Need(2));
        const int item = Pop();
        if (nodes_[Top()].kind != Node::kList) return Bad("APPEND to a " + Describe(Top()));
        nodes_[Top()].items.push_back(item);
        return absl::OkStatus();
      }
      case 'e': {
        CONVEYOR_ASSIGN_OR_RETURN(std::vector<int> items, PopMark());
        CONVEYOR_RETURN_IF_ERROR(Need(1));
        if (nodes_[Top()].kind != Node::kList) return Bad("APPENDS to a " + Describe(Top()));
        auto& list = nodes_[Top()].items;
        list.insert(list.end(), items.begin(), items.end());
        return absl::OkStatus();
      }
      case '}': PushContainer(Node::kDict, {}); return absl::OkStatus();
      case 'd': {
        CONVEYOR_ASSIGN_OR_RETURN(std::vector<int> items, PopMark());
        if (items.size() % 2) return Bad("DICT with an odd number of items");
        const int d = PushContainer(Node::kDict, {});
        for (std::size_t k = 0; k < items.size(); k += 2) CONVEYOR_RETURN_IF_ERROR(SetItem(d, items[k], items[k + 1]));
        return absl::OkStatus();
      }
      case 's': {
        CONVEYOR_RETURN_IF_ERROR(Need(3));
        const int value = Pop();
        const int key = Pop();
        return SetItem(Top(), key, value);
      }
      case 'u': {
        CONVEYOR_ASSIGN_OR_RETURN(std::vector<int> items, PopMark());
        CONVEYOR_RETURN_IF_ERROR(Need(1));
        if (items.size() % 2) return Bad("SETITEMS with an odd number of items");
        for (std::size_t k = 0; k < items.size(); k += 2) CONVEYOR_RETURN_IF_ERROR(SetItem(Top(), items[k], items[k + 1]));
        return absl::OkStatus();
      }
      case 'c': {
        std::string module, name;
        CONVEYOR_RETURN_IF_ERROR(ReadLine(&module));
        CONVEYOR_RETURN_IF_ERROR(ReadLine(&name));
        return Global(module, name);
      }
      case 0x93: {  // STACK_GLOBAL
        CONVEYOR_RETURN_IF_ERROR(Need(2));
        const int name = Pop();
        const int module = Pop();
        if (!IsScalar(module, K::kString) || !IsScalar(name, K::kString)) return Bad("STACK_GLOBAL of non-strings");
        return Global(nodes_[module].scalar.s, nodes_[name].scalar.s);
      }
      case 'R': return Reduce();
      case 'b': {  // BUILD: only an OrderedDict's attributes (state_dict's _metadata), dropped
        CONVEYOR_RETURN_IF_ERROR(Need(2));
        const int state = Pop();
        if (nodes_[Top()].kind != Node::kDict || !nodes_[Top()].ordered || nodes_[state].kind != Node::kDict)
          return Bad("BUILD of a " + Describe(Top()) + " (only an OrderedDict's attributes)");
        return absl::OkStatus();
      }
      case 'Q': return PersistentLoad();
      case 'h': CONVEYOR_RETURN_IF_ERROR(ReadLe(1, &v)); return Get(v);
      case 'j': CONVEYOR_RETURN_IF_ERROR(ReadLe(4, &v)); return Get(v);
      case 'q': CONVEYOR_RETURN_IF_ERROR(ReadLe(1, &v)); return Memo(v);
      case 'r': CONVEYOR_RETURN_IF_ERROR(ReadLe(4, &v)); return Memo(v);
      case 0x94: return Memo(memo_.size());  // MEMOIZE
      case 0x81: {                             // NEWOBJ
        CONVEYOR_RETURN_IF_ERROR(Need(2));
        return Refuse(Describe(stack_[stack_.size() - 2]) + " through NEWOBJ");
      }
      default: {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02x", op);
        return Bad(std::string("unsupported pickle opcode ") + hex);
      }
    }
  }

  // The node graph as a tree; bounded in depth and size (a cycle or a
  // memo-shared blow-up is refused).
  StatusOr<PickleValue> Convert(int id, int depth, int64_t* budget) const {
    if (depth > 100) return Bad("values nested deeper than 100 (or a cycle)");
    if (--*budget < 0) return Bad("too many values (a memo-shared structure copied over and over?)");
    const Node& node = nodes_[id];
    PickleValue out;
    switch (node.kind) {
      case Node::kValue: return node.scalar;
      case Node::kTensor:
        out.kind = PickleValue::Kind::kTensor;
        out.tensor = node.tensor;
        return out;
      case Node::kList:
      case Node::kTuple:
      case Node::kDict:
        out.kind = node.kind == Node::kList    ? PickleValue::Kind::kList
                   : node.kind == Node::kTuple ? PickleValue::Kind::kTuple
                                               : PickleValue::Kind::kDict;
        out.ordered = node.ordered;
        for (int item : node.items) {
          CONVEYOR_ASSIGN_OR_RETURN(PickleValue v, Convert(item, depth + 1, budget));
          out.items.push_back(std::move(v));
        }
        for (int key : node.keys) {
          CONVEYOR_ASSIGN_OR_RETURN(PickleValue v, Convert(key, depth + 1, budget));
          out.keys.push_back(std::move(v));
        }
        return out;
      case Node::kCallable: return Bad("the result holds " + node.callable_name + " itself");
      case Node::kStorage: return Bad("the result holds a bare storage (only tensors over storages)");
    }
    return Bad("?");
  }

  const uint8_t* p_;
  std::size_t n_;
  std::size_t pos_ = 0, op_at_ = 0;
  std::string where_;
  const std::map<std::string, ByteSpan>& storages_;
  std::vector<Node> nodes_;
  std::vector<int> stack_;
  std::vector<std::size_t> marks_;
  std::unordered_map<uint64_t, int> memo_;
};

}  // namespace

StatusOr<PickleValue> UnpickleRestricted(std::string_view pickle, const std::map<std::string, ByteSpan>& storages,
                                         const std::string& where) {
  Unpickler unpickler(reinterpret_cast<const uint8_t*>(pickle.data()), pickle.size(), where, storages);
  return unpickler.Load();
}

// -------------------------------------------------------------- TorchFile ---

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

// ----------------------------------------------------------------- writer ---

namespace {

class PickleWriter {
 public:
  PickleWriter() { out_ = "\x80\x02"; }
  void Op(char op) { out_ += op; }
  void Raw(uint64_t v, int bytes) {
    for (int k = 0; k < bytes; ++k) out_ += static_cast<char>((v >> (8 * k)) & 0xff);
  }
  void Int(int64_t v) {
    if (v >= 0 && v < 256) {
      Op('K');
      Raw(v, 1);
    } else if (v >= 0 && v < 65536) {
      Op('M');
      Raw(v, 2);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
      Op('J');
      Raw(static_cast<uint32_t>(v), 4);
    } else {  // LONG1: little-endian two's complement, 8 bytes is always enough
      Op('\x8a');
      Raw(8, 1);
      Raw(static_cast<uint64_t>(v), 8);
    }
  }
  void Str(const std::string& s) {
    Op('X');
    Raw(s.size(), 4);
    out_ += s;
  }
  // A global, memoized (BINPUT once, BINGET after).
  void Global(const std::string& module, const std::string& name) {
    const std::string full = module + "\n" + name + "\n";
    auto it = memo_.find(full);
    if (it != memo_.end()) {
      Get(it->second);
      return;
    }
    Op('c');
    out_ += full;
    const uint32_t index = static_cast<uint32_t>(memo_.size());
    memo_[full] = index;
    if (index < 256) {
      Op('q');
      Raw(index, 1);
    } else {
      Op('r');
      Raw(index, 4);
    }
  }
  void Tuple(const std::vector<int64_t>& v) {
    if (v.empty()) {
      Op(')');
      return;
    }
    if (v.size() > 3) Op('(');
    for (int64_t x : v) Int(x);
    Op(v.size() == 1 ? '\x85' : v.size() == 2 ? '\x86' : v.size() == 3 ? '\x87' : 't');
  }
  std::string& out() { return out_; }

 private:
  void Get(uint32_t index) {
    if (index < 256) {
      Op('h');
      Raw(index, 1);
    } else {
      Op('j');
      Raw(index, 4);
    }
  }
  std::string out_;
  std::map<std::string, uint32_t> memo_;
};

void Put(std::string* s, uint64_t v, int bytes) {
  for (int k = 0; k < bytes; ++k) s->push_back(static_cast<char>((v >> (8 * k)) & 0xff));
}

class ZipWriter {
 public:
  explicit ZipWriter(bool force_zip64) : force_zip64_(force_zip64) {}

  // Adds a stored entry; `data` must stay valid until the pieces are written.
  void Add(const std::string& name, std::string_view data) {
    const bool zip64 = force_zip64_ || data.size() >= 0xFFFFFFFFu || offset_ >= 0xFFFFFFFFu;
    const uint32_t crc = Crc32(reinterpret_cast<const uint8_t*>(data.data()), data.size());
    std::string header;
    Put(&header, kLocalSig, 4);
    Put(&header, zip64 ? 45 : 20, 2);  // version needed
    Put(&header, 0, 2);                // flags
    Put(&header, 0, 2);                // stored
    Put(&header, 0, 4);                // time, date
    Put(&header, crc, 4);
    Put(&header, zip64 ? 0xFFFFFFFFu : data.size(), 4);
    Put(&header, zip64 ? 0xFFFFFFFFu : data.size(), 4);
    const uint64_t fixed = 30 + name.size() + (zip64 ? 20 : 0) + 4;
    const uint64_t pad = (64 - (offset_ + fixed) % 64) % 64;  // data on a 64-byte boundary, as torch.save
    Put(&header, name.size(), 2);
    Put(&header, (zip64 ? 20 : 0) + 4 + pad, 2);
    header += name;
    if (zip64) {
      Put(&header, 1, 2);
      Put(&header, 16, 2);
      Put(&header, data.size(), 8);
      Put(&header, data.size(), 8);
    }
    Put(&header, 0x4246, 2);  // "FB": torch's padding field
    Put(&header, pad, 2);
    header.append(pad, 'Z');
    central_.push_back({name, crc, data.size(), offset_});
    offset_ += header.size() + data.size();
    Piece(std::move(header));
    pieces_.push_back(data);
  }

  // The central directory and its end records; then pieces() is the file.
  void Finish() {
    std::string cd;
    const uint64_t cd_offset = offset_;
    bool any64 = force_zip64_ || central_.size() >= 0xFFFF;
    for (const auto& e : central_) {
      const bool big_size = force_zip64_ || e.size >= 0xFFFFFFFFu;
      const bool big_offset = force_zip64_ || e.offset >= 0xFFFFFFFFu;
      const int extra = (big_size ? 16 : 0) + (big_offset ? 8 : 0);
      any64 |= extra > 0;
      Put(&cd, kCentralSig, 4);
      Put(&cd, 0x0300 | 45, 2);  // made by: unix, 4.5
      Put(&cd, extra ? 45 : 20, 2);
      Put(&cd, 0, 2);
      Put(&cd, 0, 2);
      Put(&cd, 0, 4);
      Put(&cd, e.crc, 4);
      Put(&cd, big_size ? 0xFFFFFFFFu : e.size, 4);
      Put(&cd, big_size ? 0xFFFFFFFFu : e.size, 4);
      Put(&cd, e.name.size(), 2);
      Put(&cd, extra ? 4 + extra : 0, 2);
      Put(&cd, 0, 2);  // comment
      Put(&cd, 0, 2);  // disk
      Put(&cd, 0, 2);  // internal attributes
      Put(&cd, 0, 4);  // external attributes
      Put(&cd, big_offset ? 0xFFFFFFFFu : e.offset, 4);
      cd += e.name;
      if (extra) {
        Put(&cd, 1, 2);
        Put(&cd, extra, 2);
        if (big_size) {
          Put(&cd, e.size, 8);
          Put(&cd, e.size, 8);
        }
        if (big_offset) Put(&cd, e.offset, 8);
      }
    }
    const uint64_t cd_size = cd.size();
    any64 |= cd_offset >= 0xFFFFFFFFu || cd_size >= 0xFFFFFFFFu;
    if (any64) {
      const uint64_t end64 = cd_offset + cd_size;
      Put(&cd, kEnd64Sig, 4);
      Put(&cd, 44, 8);
      Put(&cd, 45, 2);
      Put(&cd, 45, 2);
      Put(&cd, 0, 4);
      Put(&cd, 0, 4);
      Put(&cd, central_.size(), 8);
      Put(&cd, central_.size(), 8);
      Put(&cd, cd_size, 8);
      Put(&cd, cd_offset, 8);
      Put(&cd, kLocator64Sig, 4);
      Put(&cd, 0, 4);
      Put(&cd, end64, 8);
      Put(&cd, 1, 4);
    }
    Put(&cd, kEndSig, 4);
    Put(&cd, 0, 4);
    const uint64_t count = any64 ? 0xFFFF : central_.size();
    Put(&cd, count, 2);
    Put(&cd, count, 2);
    Put(&cd, any64 ? 0xFFFFFFFFu : cd_size, 4);
    Put(&cd, any64 ? 0xFFFFFFFFu : cd_offset, 4);
    Put(&cd, 0, 2);
    Piece(std::move(cd));
  }

  const std::vector<std::string_view>& pieces() const { return pieces_; }

 private:
  struct Central {
    std::string name;
    uint32_t crc;
    uint64_t size, offset;
  };
  void Piece(std::string s) {
    owned_.push_back(std::move(s));
    pieces_.push_back(owned_.back());
  }
  bool force_zip64_;
  uint64_t offset_ = 0;
  std::vector<Central> central_;
  std::deque<std::string> owned_;  // stable addresses for the pieces
  std::vector<std::string_view> pieces_;
};

}  // namespace

Status WriteTorchFile(const std::string& path, const std::vector<std::pair<std::string, TensorRecord>>& tensors,
                      const TorchWriteOptions& options) {
  if (options.archive.empty() || options.archive.find('/') != std::string::npos)
    return absl::InvalidArgumentError(path + ": archive name '" + options.archive + "' must be one folder name");
  PickleWriter pickle;
  if (options.ordered_dict) {
    pickle.Global("collections", "OrderedDict");
    pickle.Op(')');
    pickle.Op('R');
  } else {
    pickle.Op('}');
  }
  if (!tensors.empty()) pickle.Op('(');
  for (std::size_t n = 0; n < tensors.size(); ++n) {
    const auto& [name, t] = tensors[n];
    const int64_t elem = TorchDTypeSize(t.dtype);
    const std::vector<int64_t> strides = t.strides.empty() ? ContiguousStrides(t.shape) : t.strides;
    int64_t extent;
    if (strides.size() != t.shape.size() || !ViewExtent(t.shape, strides, &extent) ||
        t.nbytes % elem != 0 || extent > static_cast<int64_t>(t.nbytes / elem) || (t.nbytes > 0 && !t.data))
      return absl::InvalidArgumentError(path + ": tensor '" + name + "' (" + TorchDTypeName(t.dtype) +
                                        "): its shape and strides reach past its " + std::to_string(t.nbytes) +
                                        " bytes");
    pickle.Str(name);
    pickle.Global("torch._utils", "_rebuild_tensor_v2");
    pickle.Op('(');
    pickle.Op('(');  // the persistent id
    pickle.Str("storage");
    pickle.Global("torch", TorchStorageName(t.dtype));
    pickle.Str(std::to_string(n));
    pickle.Str("cpu");
    pickle.Int(static_cast<int64_t>(t.nbytes / elem));
    pickle.Op('t');
    pickle.Op('Q');
    pickle.Int(0);  // storage offset
    pickle.Tuple(t.shape);
    pickle.Tuple(strides);
    pickle.Op(t.requires_grad ? '\x88' : '\x89');
    pickle.Global("collections", "OrderedDict");  // backward hooks: empty
    pickle.Op(')');
    pickle.Op('R');
    pickle.Op('t');
    pickle.Op('R');
  }
  if (!tensors.empty()) pickle.Op('u');
  pickle.Op('.');

  const std::string prefix = options.archive + "/";
  static const std::string kLittle = "little", kVersion = "3\n";
  ZipWriter zip(options.force_zip64);
  zip.Add(prefix + "data.pkl", pickle.out());
  zip.Add(prefix + "byteorder", kLittle);
  for (std::size_t n = 0; n < tensors.size(); ++n)
    zip.Add(prefix + "data/" + std::to_string(n),
            std::string_view(static_cast<const char*>(tensors[n].second.data), tensors[n].second.nbytes));
  zip.Add(prefix + "version", kVersion);
  zip.Finish();
  return WriteFileDurably(path, zip.pieces());
}

Status WriteStateDict(const std::string& path, const std::vector<std::pair<std::string, TensorRecord>>& tensors) {
  return WriteTorchFile(path, tensors, TorchWriteOptions{});
}

}  // namespace conveyor
