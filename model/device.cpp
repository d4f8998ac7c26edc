#include "model/device.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>

namespace conveyor {

int DefaultComputeThreads(const std::string& device) { return device.rfind("cuda", 0) == 0 ? 1 : 0; }

void SetComputeThreads(int threads) {
  if (threads > 0) {
    at::set_num_threads(threads);
  }
}

int ComputeThreads() { return at::get_num_threads(); }

int CudaDeviceCount() { return at::hasCUDA() ? static_cast<int>(at::getNumGPUs()) : 0; }

void SetCudnnBenchmark(bool on) { at::globalContext().setBenchmarkCuDNN(on); }

}  // namespace conveyor
