#include "model/device.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>

#include <atomic>
#include <thread>

namespace conveyor {

int DefaultComputeThreads(const std::string& device) { return device.rfind("cuda", 0) == 0 ? 1 : 0; }

AllCoresWhileBuilding::AllCoresWhileBuilding(bool raise) {
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  if (!raise || cores <= at::get_num_threads()) return;
  saved_ = at::get_num_threads();
  at::set_num_threads(cores);
}

AllCoresWhileBuilding::~AllCoresWhileBuilding() {
  if (saved_ > 0) at::set_num_threads(saved_);
}

namespace {
std::atomic<int> compute_threads{0};  // SetComputeThreads's, 0 before
}  // namespace

void SetComputeThreads(int threads) {
  if (threads > 0) {
    at::set_num_threads(threads);
  }
  compute_threads = at::get_num_threads();
}

int ComputeThreads() {
  const int threads = compute_threads.load();
  return threads > 0 ? threads : at::get_num_threads();
}

int CudaDeviceCount() { return at::hasCUDA() ? static_cast<int>(at::getNumGPUs()) : 0; }

void SetCudnnBenchmark(bool on) { at::globalContext().setBenchmarkCuDNN(on); }

}  // namespace conveyor
