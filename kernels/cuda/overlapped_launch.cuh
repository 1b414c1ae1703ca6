#pragma once
// Programmatic dependent launch (Hopper and later): a kernel of a decode step may be launched, and its blocks take
// the multiprocessors the kernel before it has left, while that kernel finishes, instead of after it. The profile of
// an H200 (bench/results/README.md, [gpu-speed]) showed batch-1 decode at Llama-3-8B shapes to be about 450
// kernels a step, 14 a layer, most of them a few microseconds long: their launches and ramps are a large part of
// the step.
//
// The contract, for every kernel launched through launch_overlapped():
// * it calls wait_for_inputs() before it reads anything that earlier work on the stream wrote, and before it
//   writes anything at all (the kernel before it may still be reading it: scratch and uploads are reused from op to
//   op). Only memory that nothing writes during a step (the weights) may be read before;
// * it calls allow_dependents() at its start, so that the next kernel may be launched once all of this one's
//   blocks are running.
// wait_for_inputs() returns once the kernel before has completed and its writes are visible; it and
// allow_dependents() do nothing in a kernel launched the ordinary way. Kernels launched the ordinary way (cuBLAS,
// the rarer ops), copies and host waits keep their full ordering on the stream, so a chain of overlapped kernels
// may sit anywhere among them.
#include <cuda_runtime.h>

#include <utility>

#include "kernels/cuda/cuda_context.h"

namespace strata::cuda {

__device__ inline void wait_for_inputs() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ inline void allow_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// kernel<<<grid, block, shared, ctx.stream()>>>(args...), with programmatic stream serialization where the
// context overlaps launches (CudaContext::overlaps_launches); throws naming `name` when the launch fails.
template <class... Params, class... Args>
void launch_overlapped(const CudaContext& ctx, const char* name, void (*kernel)(Params...), dim3 grid, dim3 block,
                       size_t shared, Args&&... args) {
  cudaLaunchAttribute overlap{};
  overlap.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  overlap.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared;
  config.stream = ctx.stream();
  config.attrs = ctx.overlaps_launches() ? &overlap : nullptr;
  config.numAttrs = ctx.overlaps_launches() ? 1 : 0;
  check(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...), name);
}

}  // namespace strata::cuda
