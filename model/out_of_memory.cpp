#include "model/out_of_memory.h"

#include <c10/util/Exception.h>

#include <cstdio>
#include <new>

namespace conveyor {

bool IsOutOfMemory(const std::exception& e) {
  if (dynamic_cast<const std::bad_alloc*>(&e) || dynamic_cast<const c10::OutOfMemoryError*>(&e)) return true;
  const std::string what = ErrorMessage(e);  // also the TorchScript interpreter's std::runtime_error
  for (const char* says : {"out of memory", "can't allocate memory", "not enough memory", "ALLOC_FAILED",
                           "Cannot allocate memory"}) {
    if (what.find(says) != std::string::npos) return true;
  }
  return false;
}

std::string ErrorMessage(const std::exception& e) {
  if (const auto* error = dynamic_cast<const c10::Error*>(&e)) return error->what_without_backtrace();
  if (dynamic_cast<const std::bad_alloc*>(&e)) return std::string("std::bad_alloc: ") + e.what();
  return e.what();
}

absl::Status TorchErrorStatus(const std::exception& e, absl::StatusCode code, const std::string& context,
                              const std::string& held) {
  std::string message = ErrorMessage(e);
  while (!message.empty() && (message.back() == '\n' || message.back() == ' ')) message.pop_back();
  if (!IsOutOfMemory(e)) return absl::Status(code, context + ": " + message);
  return absl::ResourceExhaustedError(context + ": out of memory" + (held.empty() ? "" : " (" + held + ")") +
                                      "; the allocation that failed: " + message);
}

std::string ByteString(int64_t bytes) {
  char out[32];
  if (bytes >= (int64_t{1} << 30)) {
    std::snprintf(out, sizeof(out), "%.2f GiB", static_cast<double>(bytes) / (1 << 30));
  } else if (bytes >= (int64_t{1} << 20)) {
    std::snprintf(out, sizeof(out), "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  } else if (bytes >= 1024) {
    std::snprintf(out, sizeof(out), "%.1f KiB", static_cast<double>(bytes) / 1024);
  } else {
    std::snprintf(out, sizeof(out), "%lld B", static_cast<long long>(bytes));
  }
  return out;
}

}  // namespace conveyor
