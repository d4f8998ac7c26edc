// The restricted pickle machine of torch_format/ (UnpickleRestricted,
// torch_file.h): it builds values only, and of the globals a pickle names
// takes those torch.load(weights_only=True) takes.
#include <cstdio>
#include <cstring>
#include <unordered_map>

#include "torch_format/layout.h"
#include "torch_format/torch_file.h"
#include "torch_format/zip.h"

namespace conveyor {

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

namespace {

using torch_format::AddOverflow;
using torch_format::Le;
using torch_format::MulOverflow;
using torch_format::ViewExtent;

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
    } else if (module == "torch" && torch_format::DTypeOfStorage(name, &node.dtype)) {
      node.callable = Callable::kStorageType;
    } else {
      return Refuse(full);
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

  // One opcode. The numbers and strings (PushScalar) and the containers
  // (BuildContainer) have their own switches; the stack, the memo, globals
  // and calls are here.
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
      case 'N': case 0x88: case 0x89: case 'J': case 'K': case 'M': case 0x8a: case 0x8b: case 'G':
      case 'X': case 0x8c: case 0x8d: case 'U': case 'T': case 'B': case 'C': case 0x8e:
        return PushScalar(op);
      case ')': case 't': case 0x85: case 0x86: case 0x87: case ']': case 'l': case 'a': case 'e':
      case '}': case 'd': case 's': case 'u':
        return BuildContainer(op);
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
      default: return Unsupported(op);
    }
  }

  Status Unsupported(uint8_t op) const {
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02x", op);
    return Bad(std::string("unsupported pickle opcode ") + hex);
  }

  // None, bools, ints, floats, str and bytes.
  Status PushScalar(uint8_t op) {
    using K = PickleValue::Kind;
    uint64_t v = 0;
    switch (op) {
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
      default: return Unsupported(op);
    }
  }

  // Tuples, lists and dicts: made, and filled.
  Status BuildContainer(uint8_t op) {
    switch (op) {
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
      default: return Unsupported(op);
    }
  }

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

}  // namespace conveyor
