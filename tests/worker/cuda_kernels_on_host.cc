// worker/cuda_kernels.cu compiled for the host (PS_CUDA_HOST_EMULATION is defined for this
// target): the very kernel bodies the GPU runs, under cuda_host_emulation.h.
#include "tests/worker/cuda_host_emulation.h"
#include "worker/cuda_kernels.cu"
