// The decode path of the CUDA backend's matmul: out[t, r] = sum_k x[t, k] w[r, k] for a few rows of x (T <= 8).
// There the product reads every weight once for a handful of tokens, so it is bound by memory bandwidth: one warp
// per weight row reads it in 16-byte loads (8 bf16) and multiplies them with x as the model gives it (fp32, no
// cast kernel: x is small and stays in cache), summing in fp32. Weights that share x (Q, K and V; gate and up) go
// in one launch. cuBLAS, which the larger T keep, would cost a cast of x and a launch per weight.
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/cuda_ops.h"

namespace strata::cuda {
namespace {

constexpr int kWarps = 8;  // warps per block, each on its own weight row
constexpr int kMaxRows = 8;
constexpr int kMaxWeights = 3;

struct GemvWeights {
  const __nv_bfloat16* w[kMaxWeights];
  float* out[kMaxWeights];  // [T, rows[i]]
  int rows[kMaxWeights];
};

template <int T>
__global__ void gemv_kernel(const float* __restrict__ x, int n_in, GemvWeights weights, int total_rows) {
  const int lane = threadIdx.x % 32;
  int r = blockIdx.x * kWarps + threadIdx.x / 32;
  if (r >= total_rows) return;
  int i = 0;  // the weight that row r of the stacked weights belongs to
  while (r >= weights.rows[i]) r -= weights.rows[i++];
  const auto* w = reinterpret_cast<const uint4*>(weights.w[i] + int64_t(r) * n_in);
  const auto* x4 = reinterpret_cast<const float4*>(x);
  const int chunks = n_in / 8, x4_per_row = n_in / 4;
  float sum[T] = {};
#pragma unroll 4
  for (int c = lane; c < chunks; c += 32) {
    const uint4 packed = __ldg(w + c);
    const auto* pairs = reinterpret_cast<const __nv_bfloat162*>(&packed);
    float wf[8];
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      const float2 f = __bfloat1622float2(pairs[p]);
      wf[2 * p] = f.x;
      wf[2 * p + 1] = f.y;
    }
#pragma unroll
    for (int t = 0; t < T; ++t) {
      const float4 a = __ldg(x4 + t * x4_per_row + 2 * c), b = __ldg(x4 + t * x4_per_row + 2 * c + 1);
      sum[t] += wf[0] * a.x + wf[1] * a.y + wf[2] * a.z + wf[3] * a.w + wf[4] * b.x + wf[5] * b.y + wf[6] * b.z +
                wf[7] * b.w;
    }
  }
#pragma unroll
  for (int t = 0; t < T; ++t) {
    for (int offset = 16; offset > 0; offset /= 2) sum[t] += __shfl_xor_sync(0xffffffffu, sum[t], offset);
  }
  if (lane == 0) {
#pragma unroll
    for (int t = 0; t < T; ++t) weights.out[i][int64_t(t) * weights.rows[i] + r] = sum[t];
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <int T>
void launch(CudaContext& ctx, const float* x, int n_in, const GemvWeights& weights, int total_rows) {
  const unsigned blocks = unsigned((total_rows + kWarps - 1) / kWarps);
  gemv_kernel<T><<<blocks, kWarps * 32, 0, ctx.stream()>>>(x, n_in, weights, total_rows);
  check(cudaGetLastError(), "gemv_kernel");
}

}  // namespace

bool gemv(CudaContext& ctx, const Tensor& x, std::span<const Tensor* const> w, std::span<Tensor* const> out) {
  const int64_t t = x.rows, n_in = x.cols;
  if (t < 1 || t > kMaxRows || w.empty() || w.size() > size_t(kMaxWeights) || n_in % 8 != 0 || !aligned16(x.data)) {
    return false;
  }
  GemvWeights weights{};
  int64_t total_rows = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    if (!aligned16(w[i]->data) || w[i]->rows > INT32_MAX) return false;
    weights.w[i] = static_cast<const __nv_bfloat16*>(w[i]->data);
    weights.out[i] = out[i]->f32();
    weights.rows[i] = int(w[i]->rows);
    total_rows += w[i]->rows;
  }
  if (total_rows > INT32_MAX - kWarps) return false;
  const int n = int(n_in), rows = int(total_rows);
  switch (t) {
    case 1: launch<1>(ctx, x.f32(), n, weights, rows); break;
    case 2: launch<2>(ctx, x.f32(), n, weights, rows); break;
    case 3: launch<3>(ctx, x.f32(), n, weights, rows); break;
    case 4: launch<4>(ctx, x.f32(), n, weights, rows); break;
    case 5: launch<5>(ctx, x.f32(), n, weights, rows); break;
    case 6: launch<6>(ctx, x.f32(), n, weights, rows); break;
    case 7: launch<7>(ctx, x.f32(), n, weights, rows); break;
    default: launch<8>(ctx, x.f32(), n, weights, rows); break;
  }
  return true;
}

}  // namespace strata::cuda
