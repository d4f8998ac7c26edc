// common/: the torch-free basics every other folder builds on: status and
// logging, durable files and hashes, addresses, channels and servers, TLS,
// command lines, the wire checks, executors, metrics, and PyTorch's file format
// read and written without LibTorch.
//
// Status handling: absl::Status inside the code, grpc::Status only at RPC edges.
#pragma once

#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <grpcpp/support/status.h>

#include <stdexcept>
#include <string>
#include <utility>

namespace conveyor {

using Status = absl::Status;
template <typename T>
using StatusOr = absl::StatusOr<T>;

grpc::Status ToGrpc(const Status& status);
Status FromGrpc(const grpc::Status& status);
// Prefixes the message with context ("stage 2: ..."), keeping the code.
Status Annotate(const Status& status, const std::string& context);

// A Status carried through code that cannot return one (a callback whose
// result is a value), caught where a Status is returned again.
class StatusError : public std::runtime_error {
 public:
  explicit StatusError(Status st) : std::runtime_error(std::string(st.message())), status_(std::move(st)) {}
  const Status& status() const { return status_; }

 private:
  Status status_;
};

// The value, or throws StatusError.
template <typename T>
T ValueOrThrow(StatusOr<T> v) {
  if (!v.ok()) throw StatusError(v.status());
  return *std::move(v);
}

}  // namespace conveyor

#define CONVEYOR_RETURN_IF_ERROR(expr)        \
  do {                                        \
    ::conveyor::Status _st = (expr);          \
    if (!_st.ok()) return _st;                \
  } while (0)

#define CONVEYOR_CONCAT_INNER(a, b) a##b
#define CONVEYOR_CONCAT(a, b) CONVEYOR_CONCAT_INNER(a, b)
#define CONVEYOR_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                   \
  if (!tmp.ok()) return tmp.status();                  \
  lhs = std::move(*tmp)
#define CONVEYOR_ASSIGN_OR_RETURN(lhs, expr) \
  CONVEYOR_ASSIGN_OR_RETURN_IMPL(CONVEYOR_CONCAT(_statusor_, __LINE__), lhs, expr)
