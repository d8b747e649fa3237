#pragma once
// How cuda_kernels.cu launches its kernels: with nvcc, the <<<blocks, threads, 0, stream>>>
// syntax. Tests define PS_CUDA_HOST_EMULATION and include tests/worker/cuda_host_emulation.h
// first, and the same kernel bodies then run on the host (every thread of a block in turn, or
// as real threads when the kernel synchronizes them), so machines without a GPU test the
// kernels' indexing and reductions against the CPU backend.
//   PS_LAUNCH(kernel, blocks, threads, stream, args...)
//   PS_LAUNCH_SYNCED(...)  the same, for a kernel that calls __syncthreads
#ifdef PS_CUDA_HOST_EMULATION
#define PS_LAUNCH(kernel, blocks, threads, stream, ...) \
  ::ps::cuda_emulation::Launch((blocks), (threads), (stream), kernel, __VA_ARGS__)
#define PS_LAUNCH_SYNCED(kernel, blocks, threads, stream, ...) \
  ::ps::cuda_emulation::LaunchSynced((blocks), (threads), (stream), kernel, __VA_ARGS__)
#else
#define PS_LAUNCH(kernel, blocks, threads, stream, ...) \
  kernel<<<(blocks), (threads), 0, (stream)>>>(__VA_ARGS__)
#define PS_LAUNCH_SYNCED PS_LAUNCH
#endif
