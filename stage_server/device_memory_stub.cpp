// A build without CUDA: no GPU memory to report.
#include <cstdint>
#include <string>

namespace conveyor {

int64_t CudaReservedBytes(const std::string&) { return -1; }

}  // namespace conveyor
