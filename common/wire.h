// Tensors on the wire (conveyor.v1.Tensor): checks, torch-free, so the very
// decoder the servers use can be fuzzed without LibTorch.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/status.h"
#include "conveyor.pb.h"

namespace conveyor {

// Bytes per element; 0 for an unknown dtype.
int64_t DTypeSize(v1::DType dtype);
std::string DTypeName(v1::DType dtype);
std::string ShapeString(const std::vector<int64_t>& shape);

// INVALID_ARGUMENT naming `what`, unless `t` has exactly this dtype and shape
// and as many bytes as they imply.
Status CheckWireTensor(const v1::Tensor& t, v1::DType dtype, const std::vector<int64_t>& shape,
                       const std::string& what);
// The same for a tensor whose `payload_bytes` travel apart from `t` (which
// then has no data); -1: not here yet, the byte count is not checked.
Status CheckWireTensor(const v1::Tensor& t, int64_t payload_bytes, v1::DType dtype,
                       const std::vector<int64_t>& shape, const std::string& what);

// Data bytes per GetParameters reply when the parameters are gathered: well
// under kMaxMessageBytes (common/net.h, 1 GiB), so that a stage holding more
// answers in several replies.
constexpr int64_t kParameterPageBytes = int64_t{256} << 20;

// One stage's parameters and buffers in one reply, fetched page by page:
// `call` is GetParameters on that stage, asked for tensors from
// JobRef.first_tensor on with JobRef.max_bytes = `page_bytes`, until
// ParametersReply.next_tensor is 0. INVALID_ARGUMENT when a reply does not
// advance; `call`'s errors as they are.
StatusOr<v1::ParametersReply> GatherParameters(
    const std::string& job_id, const std::function<StatusOr<v1::ParametersReply>(const v1::JobRef&)>& call,
    int64_t page_bytes = kParameterPageBytes);

}  // namespace conveyor
