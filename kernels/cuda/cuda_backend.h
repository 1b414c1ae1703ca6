#pragma once
// The CUDA backend (kernels/cuda/): bf16 weights and KV blocks, fp32 activations, accumulation and softmax, cuBLAS
// for the GEMMs. Built when CMake finds nvcc (STRATA_CUDA); every op is tested against a reference, a plain double
// one or its CPU twin (tests/kernels/cuda/, a file per op named like its kernel), and those tests skip themselves,
// with the reason, where no GPU is present.
#include <memory>
#include <string>

#include "kernels/backend.h"

namespace strata {

// GPUs this process can use; 0 when there is no driver or no device (cuda_unavailable_reason() says which).
int cuda_device_count();
std::string cuda_unavailable_reason();

// A backend on device `device` (0 <= device < cuda_device_count()); throws std::runtime_error naming the device
// when it cannot be used. overlap_launches (engine.cuda_overlap): a decode step's kernels launched overlapped where
// the device allows it (kernels/cuda/overlapped_launch.cuh).
std::unique_ptr<Backend> make_cuda_backend(int device, bool overlap_launches = true);

// The cudaStream_t (as void*) on which a CUDA backend queues its work, so that NCCL's collectives on its tensors are
// ordered with it (parallel/nccl_comm.h); throws std::invalid_argument for a backend that is not CUDA.
void* cuda_stream(Backend& backend);

}  // namespace strata
