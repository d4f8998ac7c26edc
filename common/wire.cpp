#include "common/wire.h"

#include "common/torch_file.h"

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

namespace {

StatusOr<TorchDType> ToTorchDType(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT32: return TorchDType::kFloat32;
    case v1::DTYPE_FLOAT64: return TorchDType::kFloat64;
    case v1::DTYPE_BFLOAT16: return TorchDType::kBFloat16;
    case v1::DTYPE_FLOAT16: return TorchDType::kFloat16;
    case v1::DTYPE_INT64: return TorchDType::kInt64;
    case v1::DTYPE_INT32: return TorchDType::kInt32;
    case v1::DTYPE_INT16: return TorchDType::kInt16;
    case v1::DTYPE_INT8: return TorchDType::kInt8;
    case v1::DTYPE_UINT8: return TorchDType::kUInt8;
    case v1::DTYPE_BOOL: return TorchDType::kBool;
    default: return absl::InvalidArgumentError("unknown dtype " + std::to_string(dtype));
  }
}

}  // namespace

Status WriteWireStateDict(const std::string& path, const std::vector<v1::ParametersReply>& parts) {
  std::vector<std::pair<std::string, TensorRecord>> records;
  for (const v1::ParametersReply& part : parts) {
    for (const auto* list : {&part.parameters(), &part.buffers()}) {
      for (const v1::NamedTensor& nt : *list) {
        const v1::Tensor& t = nt.tensor();
        std::vector<int64_t> shape(t.shape().begin(), t.shape().end());
        CONVEYOR_RETURN_IF_ERROR(Annotate(CheckWireTensor(t, t.dtype(), shape, nt.name()), "saving"));
        TensorRecord r;
        CONVEYOR_ASSIGN_OR_RETURN(r.dtype, ToTorchDType(t.dtype()));
        r.shape = shape;
        r.strides.assign(shape.size(), 1);
        for (int i = static_cast<int>(shape.size()) - 2; i >= 0; --i)
          r.strides[static_cast<std::size_t>(i)] = r.strides[static_cast<std::size_t>(i) + 1] * shape[static_cast<std::size_t>(i) + 1];
        r.data = t.data().data();
        r.nbytes = t.data().size();
        records.emplace_back(nt.name(), std::move(r));
      }
    }
  }
  return WriteStateDict(path, records);
}

}  // namespace conveyor
