#include "transport/tensor_codec.h"

#include <ATen/ATen.h>

#include <cstring>

namespace conveyor {

StatusOr<v1::DType> ToWireDType(c10::ScalarType type) {
  switch (type) {
    case at::kFloat: return v1::DTYPE_FLOAT32;
    case at::kDouble: return v1::DTYPE_FLOAT64;
    case at::kBFloat16: return v1::DTYPE_BFLOAT16;
    case at::kHalf: return v1::DTYPE_FLOAT16;
    case at::kLong: return v1::DTYPE_INT64;
    case at::kInt: return v1::DTYPE_INT32;
    case at::kShort: return v1::DTYPE_INT16;
    case at::kChar: return v1::DTYPE_INT8;
    case at::kByte: return v1::DTYPE_UINT8;
    case at::kBool: return v1::DTYPE_BOOL;
    default:
      return absl::InvalidArgumentError(std::string("dtype ") + c10::toString(type) +
                                        " cannot travel between stages");
  }
}

c10::ScalarType FromWireDType(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT64: return at::kDouble;
    case v1::DTYPE_BFLOAT16: return at::kBFloat16;
    case v1::DTYPE_FLOAT16: return at::kHalf;
    case v1::DTYPE_INT64: return at::kLong;
    case v1::DTYPE_INT32: return at::kInt;
    case v1::DTYPE_INT16: return at::kShort;
    case v1::DTYPE_INT8: return at::kChar;
    case v1::DTYPE_UINT8: return at::kByte;
    case v1::DTYPE_BOOL: return at::kBool;
    default: return at::kFloat;
  }
}

Status EncodeTensor(const at::Tensor& t, v1::Tensor* out) {
  CONVEYOR_ASSIGN_OR_RETURN(v1::DType dtype, ToWireDType(t.scalar_type()));
  at::Tensor host = t.detach().to(at::kCPU).contiguous();
  out->set_dtype(dtype);
  out->clear_shape();
  for (int64_t d : host.sizes()) out->add_shape(d);
  out->mutable_data()->assign(static_cast<const char*>(host.data_ptr()),
                              static_cast<std::size_t>(host.numel() * host.element_size()));
  return absl::OkStatus();
}

at::Tensor DecodeTensor(v1::Tensor* in) {
  auto* bytes = new std::string(std::move(*in->mutable_data()));
  std::vector<int64_t> shape(in->shape().begin(), in->shape().end());
  return at::from_blob(
      bytes->data(), shape, [bytes](void*) { delete bytes; },
      at::TensorOptions().dtype(FromWireDType(in->dtype())));
}

}  // namespace conveyor
