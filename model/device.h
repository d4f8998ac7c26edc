// Process-wide compute settings, behind a torch-free header.
#pragma once

#include <string>

namespace conveyor {

// Intra-op threads a process computing on `device` ("cpu", "cuda", "cuda:1")
// gets when none are asked for: 1 on a CUDA device, where the host only
// launches kernels and gathers batches, and LibTorch's OpenMP team (one
// thread per core, spinning between ops) took the cores the launching thread
// needed: the Fashion-MNIST ConvNet's epoch on an H100 went from 5.1-5.6 s to
// 1.4 s with one thread on a 32-core host. 0 (LibTorch's default) elsewhere.
int DefaultComputeThreads(const std::string& device);

// While it lives, the process computes with every core (a model's
// construction and random initialisation run on the host: W2's 1.34 B
// parameters took seconds longer on one thread); then back to the count it
// had. `raise` false: changes nothing.
class AllCoresWhileBuilding {
 public:
  explicit AllCoresWhileBuilding(bool raise);
  ~AllCoresWhileBuilding();
  AllCoresWhileBuilding(const AllCoresWhileBuilding&) = delete;
  AllCoresWhileBuilding& operator=(const AllCoresWhileBuilding&) = delete;

 private:
  int saved_ = 0;  // 0: nothing changed
};

// Intra-op threads for this process; 0 leaves LibTorch's default.
void SetComputeThreads(int threads);
// The count SetComputeThreads left, from any thread without touching
// LibTorch's pools: at::get_num_threads() on a thread that never ran
// LibTorch work initialises that thread's pools (LibTorch 1.13 recreates its
// pthreadpool, whose workers then spin), which a gRPC handler thread must not
// do once a step (2.7 ms a step of a tiny CPU job, most of it spinning).
int ComputeThreads();

// CUDA devices this process can use (0 in a CPU-only build).
int CudaDeviceCount();

// torch.backends.cudnn.benchmark for this process (job key cudnn_benchmark).
void SetCudnnBenchmark(bool on);

}  // namespace conveyor
