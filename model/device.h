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

// Intra-op threads for this process; 0 leaves LibTorch's default.
void SetComputeThreads(int threads);
int ComputeThreads();

// CUDA devices this process can use (0 in a CPU-only build).
int CudaDeviceCount();

// torch.backends.cudnn.benchmark for this process (job key cudnn_benchmark).
void SetCudnnBenchmark(bool on);

}  // namespace conveyor
