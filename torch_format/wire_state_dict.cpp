// WriteWireStateDict (wire_state_dict.h): the wire's tensors through
// WriteStateDict (torch_file.h).
#include "torch_format/wire_state_dict.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/wire.h"
#include "torch_format/torch_file.h"

namespace conveyor {
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
