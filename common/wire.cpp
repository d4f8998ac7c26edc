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

StatusOr<v1::ParametersReply> GatherParameters(
    const std::string& job_id, const std::function<StatusOr<v1::ParametersReply>(const v1::JobRef&)>& call,
    int64_t page_bytes) {
  v1::ParametersReply all;
  v1::JobRef ref;
  ref.set_job_id(job_id);
  ref.set_max_bytes(page_bytes);
  for (;;) {
    CONVEYOR_ASSIGN_OR_RETURN(v1::ParametersReply page, call(ref));
    for (auto& t : *page.mutable_parameters()) *all.add_parameters() = std::move(t);
    for (auto& t : *page.mutable_buffers()) *all.add_buffers() = std::move(t);
    if (page.next_tensor() == 0) return all;
    if (page.next_tensor() <= ref.first_tensor())
      return absl::InvalidArgumentError("GetParameters from tensor " + std::to_string(ref.first_tensor()) +
                                        " answered next_tensor " + std::to_string(page.next_tensor()));
    ref.set_first_tensor(page.next_tensor());
  }
}

}  // namespace conveyor
