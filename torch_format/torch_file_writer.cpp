// WriteTorchFile (torch_file.h): a dict of tensors in the layout torch.save
// writes, its pickle made here and its zip by ZipWriter (zip.h).
#include <map>
#include <string_view>

#include "common/files.h"
#include "torch_format/layout.h"
#include "torch_format/torch_file.h"
#include "torch_format/zip.h"

namespace conveyor {
namespace {

using torch_format::ContiguousStrides;
using torch_format::ViewExtent;
using torch_format::ZipWriter;

// The protocol-2 opcodes torch.save's state_dicts use, and a memo of the
// globals named.
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
