// Process-wide compute settings, behind a torch-free header.
#pragma once

namespace conveyor {

// Intra-op threads for this process; 0 leaves LibTorch's default.
void SetComputeThreads(int threads);
int ComputeThreads();

// CUDA devices this process can use (0 in a CPU-only build).
int CudaDeviceCount();

// torch.backends.cudnn.benchmark for this process (job key cudnn_benchmark).
void SetCudnnBenchmark(bool on);

}  // namespace conveyor
