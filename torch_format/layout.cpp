#include "torch_format/layout.h"

namespace conveyor {
namespace torch_format {
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

}  // namespace

bool DTypeOfStorage(const std::string& name, TorchDType* dtype) {
  for (const auto& info : kDTypes) {
    if (name == info.storage) {
      *dtype = info.dtype;
      return true;
    }
  }
  return false;
}

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

}  // namespace torch_format

int64_t TorchDTypeSize(TorchDType dtype) { return torch_format::Info(dtype).size; }
std::string TorchDTypeName(TorchDType dtype) { return torch_format::Info(dtype).name; }
std::string TorchStorageName(TorchDType dtype) { return torch_format::Info(dtype).storage; }

int64_t TensorRef::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

bool TensorRef::is_contiguous() const {
  const std::vector<int64_t> want = torch_format::ContiguousStrides(shape);
  for (std::size_t d = 0; d < shape.size(); ++d)
    if (shape[d] > 1 && strides[d] != want[d]) return false;
  return true;
}

}  // namespace conveyor
