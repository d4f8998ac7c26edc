#include "model/state_dict.h"

#include <cstring>

namespace conveyor {

namespace {

constexpr std::pair<TorchDType, at::ScalarType> kTypes[] = {
    {TorchDType::kFloat32, at::kFloat}, {TorchDType::kFloat64, at::kDouble}, {TorchDType::kFloat16, at::kHalf},
    {TorchDType::kBFloat16, at::kBFloat16}, {TorchDType::kInt64, at::kLong}, {TorchDType::kInt32, at::kInt},
    {TorchDType::kInt16, at::kShort}, {TorchDType::kInt8, at::kChar}, {TorchDType::kUInt8, at::kByte},
    {TorchDType::kBool, at::kBool},
};

// One tensor per (storage, dtype) over the file's bytes; every tensor of the
// file is a strided view of one of them, as in Python.
StatusOr<std::vector<std::pair<std::string, at::Tensor>>> ReadTensors(const std::string& path,
                                                                      const ReadTensorsOptions& options) {
  CONVEYOR_ASSIGN_OR_RETURN(std::unique_ptr<TorchFile> file, TorchFile::Open(path));
  CONVEYOR_ASSIGN_OR_RETURN(auto entries, file->TensorEntries());
  std::map<std::pair<std::string, TorchDType>, at::Tensor> bases;
  std::vector<std::pair<std::string, at::Tensor>> out;
  out.reserve(entries.size());
  try {
    for (const auto& [name, ref] : entries) {
      at::ScalarType type;
      ToScalarType(ref.dtype, &type);  // every TorchDType has one
      at::Tensor& base = bases[{ref.storage_key, ref.dtype}];
      if (!base.defined()) {
        const ByteSpan span = file->Storage(ref.storage_key);
        const int64_t elem = TorchDTypeSize(ref.dtype);
        const int64_t numel = static_cast<int64_t>(span.size) / elem;
        const auto opts = at::TensorOptions().dtype(type).device(at::kCPU);
        if (options.copy || reinterpret_cast<uintptr_t>(span.data) % elem != 0) {
          base = at::empty({numel}, opts);
          if (span.size > 0) std::memcpy(base.data_ptr(), span.data, span.size);
        } else {
          std::shared_ptr<FileBytes> keep = file->bytes();
          base = at::from_blob(file->MutableData(span), {numel}, [keep](void*) {}, opts);
        }
      }
      at::Tensor t = base.as_strided(ref.shape, ref.strides, ref.storage_offset);
      if (ref.requires_grad && at::isFloatingType(type)) t.set_requires_grad(true);
      out.emplace_back(name, std::move(t));
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(path + ": making tensors: " + e.what_without_backtrace());
  }
  return out;
}

}  // namespace

bool ToScalarType(TorchDType dtype, at::ScalarType* out) {
  for (const auto& [d, t] : kTypes)
    if (d == dtype) {
      *out = t;
      return true;
    }
  return false;
}

bool FromScalarType(at::ScalarType type, TorchDType* out) {
  for (const auto& [d, t] : kTypes)
    if (t == type) {
      *out = d;
      return true;
    }
  return false;
}

StatusOr<std::vector<std::pair<std::string, at::Tensor>>> ReadStateDict(const std::string& path,
                                                                        const ReadTensorsOptions& options) {
  return ReadTensors(path, options);
}

StatusOr<std::map<std::string, at::Tensor>> ReadTensorDict(const std::string& path, const ReadTensorsOptions& options) {
  CONVEYOR_ASSIGN_OR_RETURN(auto tensors, ReadTensors(path, options));
  return std::map<std::string, at::Tensor>(std::make_move_iterator(tensors.begin()),
                                           std::make_move_iterator(tensors.end()));
}

Status WriteStateDict(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  std::vector<at::Tensor> cpu;  // keeps the bytes alive during the write
  std::vector<std::pair<std::string, TensorRecord>> records;
  cpu.reserve(tensors.size());
  records.reserve(tensors.size());
  try {
    for (const auto& [name, tensor] : tensors) {
      if (!tensor.defined()) return absl::InvalidArgumentError(path + ": tensor '" + name + "' is undefined");
      if (tensor.layout() != at::kStrided)
        return absl::InvalidArgumentError(path + ": tensor '" + name + "' is not strided (sparse?); only dense tensors");
      TensorRecord r;
      if (!FromScalarType(tensor.scalar_type(), &r.dtype))
        return absl::InvalidArgumentError(path + ": tensor '" + name + "' has dtype " +
                                          std::string(c10::toString(tensor.scalar_type())) + ", not one written here");
      cpu.push_back(tensor.detach().to(at::kCPU).contiguous());
      const at::Tensor& t = cpu.back();
      r.shape = t.sizes().vec();
      r.data = t.data_ptr();
      r.nbytes = static_cast<std::size_t>(t.numel()) * t.element_size();
      records.emplace_back(name, std::move(r));
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(path + ": copying tensors to the CPU: " + e.what_without_backtrace());
  }
  return WriteTorchFile(path, records);
}

}  // namespace conveyor
