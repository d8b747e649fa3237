#pragma once
// Just enough of CUDA's execution model to run worker/cuda_kernels.cu on the host (see
// worker/cuda_launch.h): the qualifiers, threadIdx/blockIdx/blockDim/gridDim, __syncthreads and
// the runtime names the launchers use (cudaError_t, cudaStream_t, cudaSuccess,
// cudaGetLastError). Include it before the kernels, with
// PS_CUDA_HOST_EMULATION defined.
//
// Launch runs a grid's threads one after another, in reverse order, so that a kernel whose
// threads depended on each other's writes without synchronizing would show it. LaunchSynced
// runs a block's threads as real threads meeting at a barrier for __syncthreads, and the
// blocks one at a time, so a __shared__ array (a function-local static here) belongs to one
// block at a time. Test-only: the built-in variables are process-wide state, as they are on a GPU.
#include <barrier>
#include <cmath>
#include <cstddef>
#include <thread>
#include <vector>

#ifndef PS_CUDA_HOST_EMULATION
#error "define PS_CUDA_HOST_EMULATION before including cuda_host_emulation.h"
#endif

using cudaError_t = int;
using cudaStream_t = void*;
constexpr cudaError_t cudaSuccess = 0;
inline cudaError_t cudaGetLastError() { return cudaSuccess; }

#define __global__
#define __device__
#define __shared__ static

namespace ps::cuda_emulation {

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

inline thread_local Dim3 thread_index;
inline thread_local Dim3 block_index;
inline Dim3 block_dim;
inline Dim3 grid_dim;
inline thread_local std::barrier<>* block_barrier = nullptr;

template <typename Kernel, typename... Args>
void Launch(unsigned blocks, unsigned threads, cudaStream_t /*in order: nothing to queue*/,
            Kernel kernel, Args... args) {
  grid_dim.x = blocks;
  block_dim.x = threads;
  for (unsigned b = blocks; b-- > 0;) {
    for (unsigned t = threads; t-- > 0;) {
      block_index.x = b;
      thread_index.x = t;
      kernel(args...);
    }
  }
}

template <typename Kernel, typename... Args>
void LaunchSynced(unsigned blocks, unsigned threads, cudaStream_t /*in order*/, Kernel kernel,
                  Args... args) {
  grid_dim.x = blocks;
  block_dim.x = threads;
  // One OS thread per thread of a block, looping over the blocks; the barrier that serves
  // __syncthreads also closes each block, so the next one starts only when all have finished.
  std::barrier<> barrier(threads);
  std::vector<std::jthread> block;
  for (unsigned t = 0; t < threads; ++t) {
    block.emplace_back([&barrier, blocks, t, kernel, args...] {
      block_barrier = &barrier;
      thread_index.x = t;
      for (unsigned b = 0; b < blocks; ++b) {
        block_index.x = b;
        kernel(args...);
        barrier.arrive_and_wait();
      }
    });
  }
}

}  // namespace ps::cuda_emulation

#define threadIdx ::ps::cuda_emulation::thread_index
#define blockIdx ::ps::cuda_emulation::block_index
#define blockDim ::ps::cuda_emulation::block_dim
#define gridDim ::ps::cuda_emulation::grid_dim
inline void __syncthreads() { ::ps::cuda_emulation::block_barrier->arrive_and_wait(); }
