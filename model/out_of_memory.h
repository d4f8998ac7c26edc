// Out of memory as LibTorch reports it, and the status Conveyor answers with:
// RESOURCE_EXHAUSTED, never a crash. Torch-free header.
#pragma once

#include <absl/status/status.h>

#include <cstdint>
#include <exception>
#include <string>

namespace conveyor {

// Whether `e` says an allocation failed: c10::OutOfMemoryError (the CUDA
// caching allocator), std::bad_alloc, or an error whose message says an
// allocator could not allocate (the CPU allocator's "can't allocate memory"
// in LibTorch 1.13, "not enough memory" in 2.x; cuBLAS's and cuDNN's
// ALLOC_FAILED; CUDA's "out of memory"), a c10::Error or the
// std::runtime_error the TorchScript interpreter rethrows one as.
bool IsOutOfMemory(const std::exception& e);

// e's message, without the C++ backtrace that a c10::Error carries.
std::string ErrorMessage(const std::exception& e);

// RESOURCE_EXHAUSTED "<context>: out of memory (<held>); the allocation that
// failed: <e>" where `e` is an allocation that failed (`held`, what the
// caller held then, left out when empty), otherwise `code` "<context>: <e>".
absl::Status TorchErrorStatus(const std::exception& e, absl::StatusCode code, const std::string& context,
                              const std::string& held = "");

// "1.50 GiB", "12.0 MiB", "2.5 KiB", "512 B".
std::string ByteString(int64_t bytes);

}  // namespace conveyor
