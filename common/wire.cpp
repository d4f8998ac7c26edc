#include "common/wire.h"

namespace conveyor {

int64_t DTypeSize(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT32: return 4;
    case v1::DTYPE_FLOAT64: return 8;
    case v1::DTYPE_BFLOAT16: return 2;
    case v1::DTYPE_FLOAT16: return 2;
    case v1::DTYPE_INT64: return 8;
    case v1::DTYPE_INT32: return 4;
    case v1::DTYPE_INT16: return 2;
    case v1::DTYPE_INT8: return 1;
    case v1::DTYPE_UINT8: return 1;
    case v1::DTYPE_BOOL: return 1;
    default: return 0;
  }
}

std::string DTypeName(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT32: return "float32";
    case v1::DTYPE_FLOAT64: return "float64";
    case v1::DTYPE_BFLOAT16: return "bfloat16";
    case v1::DTYPE_FLOAT16: return "float16";
    case v1::DTYPE_INT64: return "int64";
    case v1::DTYPE_INT32: return "int32";
    case v1::DTYPE_INT16: return "int16";
    case v1::DTYPE_INT8: return "int8";
    case v1::DTYPE_UINT8: return "uint8";
    case v1::DTYPE_BOOL: return "bool";
    default: return "unknown dtype " + std::to_string(static_cast<int>(dtype));
  }
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

Status CheckWireTensor(const v1::Tensor& t, v1::DType dtype, const std::vector<int64_t>& shape,
                       const std::string& what) {
  return CheckWireTensor(t, static_cast<int64_t>(t.data().size()), dtype, shape, what);
}

Status CheckWireTensor(const v1::Tensor& t, int64_t payload_bytes, v1::DType dtype,
                       const std::vector<int64_t>& shape, const std::string& what) {
  if (t.dtype() != dtype) {
    return absl::InvalidArgumentError(what + " has dtype " + DTypeName(t.dtype()) + ", expected " +
                                      DTypeName(dtype));
  }
  std::vector<int64_t> got(t.shape().begin(), t.shape().end());
  if (got != shape) {
    return absl::InvalidArgumentError(what + " has shape " + ShapeString(got) + ", expected " +
                                      ShapeString(shape));
  }
  // Shapes here are the expected ones, already bounded; no overflow.
  int64_t bytes = DTypeSize(dtype);
  for (int64_t d : shape) bytes *= d;
  if (payload_bytes >= 0 && payload_bytes != bytes) {
    return absl::InvalidArgumentError(what + " carries " + std::to_string(payload_bytes) +
                                      " bytes, its shape needs " + std::to_string(bytes));
  }
  return absl::OkStatus();
}

}  // namespace conveyor
