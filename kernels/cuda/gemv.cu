// The CUDA backend's matmul for one row of x (a lone sequence's decode step): out[r] = sum_k x[k] w[r, k]. It reads
// every weight once for one token, so it is bound by memory bandwidth: one warp per weight row reads it in 16-byte
// loads (8 bf16) and multiplies them with x as the model gives it (fp32, no cast kernel: x stays in cache), summing
// in fp32. Weights that share x (Q, K and V; gate and up) go in one launch, where cuBLAS costs a cast of x and a
// launch per weight. On an H200 it took Llama-3-8B's batch-1 decode from 115 to 123 tokens/s; the same kernel for
// 8 rows of x (x read once per weight row and row of x) halved batch 8's, so more rows stay with cuBLAS. Two
// adjacent rows a warp (x loaded once for both) took 3% longer over a step (half the warps: the 4,096-row products
// kept 16 a multiprocessor).
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/overlapped_launch.cuh"

namespace strata::cuda {
namespace {

constexpr int kWarps = 8;  // warps per block, each on its own weight row
constexpr int kMaxWeights = 3;

struct GemvWeights {
  const __nv_bfloat16* w[kMaxWeights];
  float* out[kMaxWeights];  // [1, rows[i]]
  int rows[kMaxWeights];
};

__device__ inline void prefetch_l2(const char* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

__global__ void gemv_kernel(const float* __restrict__ x, int n_in, GemvWeights weights, int total_rows) {
  allow_dependents();
  const int lane = threadIdx.x % 32;
  int r = blockIdx.x * kWarps + threadIdx.x / 32;
  if (r >= total_rows) return;
  int i = 0;  // the weight that row r of the stacked weights belongs to
  while (r >= weights.rows[i]) r -= weights.rows[i++];
  const auto* w = reinterpret_cast<const uint4*>(weights.w[i] + int64_t(r) * n_in);
  // The weights are no output of the kernels before: the row's first 4 KiB go to L2 while those finish.
  if (lane * 128 < 2 * n_in) prefetch_l2(reinterpret_cast<const char*>(w) + lane * 128);
  wait_for_inputs();
  const auto* x4 = reinterpret_cast<const float4*>(x);
  float sum = 0.0f;
#pragma unroll 4
  for (int c = lane; c < n_in / 8; c += 32) {
    const uint4 packed = __ldg(w + c);
    const auto* pairs = reinterpret_cast<const __nv_bfloat162*>(&packed);
    const float4 a = __ldg(x4 + 2 * c), b = __ldg(x4 + 2 * c + 1);
    const float2 w01 = __bfloat1622float2(pairs[0]), w23 = __bfloat1622float2(pairs[1]);
    const float2 w45 = __bfloat1622float2(pairs[2]), w67 = __bfloat1622float2(pairs[3]);
    sum += w01.x * a.x + w01.y * a.y + w23.x * a.z + w23.y * a.w + w45.x * b.x + w45.y * b.y + w67.x * b.z +
           w67.y * b.w;
  }
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (lane == 0) weights.out[i][r] = sum;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool gemv(CudaContext& ctx, const Tensor& x, std::span<const Tensor* const> w, std::span<Tensor* const> out) {
  if (x.rows != 1 || w.empty() || w.size() > size_t(kMaxWeights) || x.cols % 8 != 0 || !aligned16(x.data)) {
    return false;
  }
  GemvWeights weights{};
  int64_t total_rows = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    if (!aligned16(w[i]->data)) return false;
    weights.w[i] = static_cast<const __nv_bfloat16*>(w[i]->data);
    weights.out[i] = out[i]->f32();
    weights.rows[i] = int(w[i]->rows);
    total_rows += w[i]->rows;
  }
  if (total_rows > INT32_MAX - kWarps) return false;
  const unsigned blocks = unsigned((total_rows + kWarps - 1) / kWarps);
  launch_overlapped(ctx, "gemv_kernel", gemv_kernel, blocks, kWarps * 32, 0, x.f32(), int(x.cols), weights,
                    int(total_rows));
  return true;
}

}  // namespace strata::cuda
