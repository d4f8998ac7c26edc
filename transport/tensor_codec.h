// LibTorch tensors <-> conveyor.v1.Tensor.
#pragma once

#include <ATen/core/Tensor.h>

#include "common/status.h"
#include "conveyor.pb.h"

namespace conveyor {

StatusOr<v1::DType> ToWireDType(c10::ScalarType type);
c10::ScalarType FromWireDType(v1::DType dtype);

// Copies `t` (any device) into `out`, contiguous, on the host.
Status EncodeTensor(const at::Tensor& t, v1::Tensor* out);

// A CPU tensor over `in`'s bytes, without a copy: the bytes are moved out of
// `in` and owned by the tensor. REQUIRES: CheckWireTensor passed.
at::Tensor DecodeTensor(v1::Tensor* in);

}  // namespace conveyor
