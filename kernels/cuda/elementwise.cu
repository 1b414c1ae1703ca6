// Row-wise and element-wise ops of the CUDA backend: embedding, rmsnorm, silu_mul, add, gather_rows and the
// f32 -> bf16 cast that feeds the GEMMs. Activations are f32; weights (the embedding table, the norms' w) bf16.
//
// Launch shapes: the row ops (embedding, rmsnorm, gather_rows) run one block per output row, the threads striding
// over the row's columns (coalesced): kRowThreads of them, rmsnorm one per 4 columns up to 1024; the element-wise
// ops run one thread per element in blocks of kThreads.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/overlapped_launch.cuh"

namespace strata::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kRowThreads = 256;

unsigned grid_for(int64_t n) { return unsigned((n + kThreads - 1) / kThreads); }

void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("cuda backend: " + what);
}

bool aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

void require_f32(const Tensor& t, const char* op, const char* name) {
  require(t.dtype == DType::f32, std::string(op) + ": " + name + " must be f32");
}

const __nv_bfloat16* bf16_weight(const Tensor& w, const char* op) {
  require(w.dtype == DType::bf16, std::string(op) + ": the weight must be bf16 (Backend::upload_weight)");
  return static_cast<const __nv_bfloat16*>(w.data);
}

__global__ void f32_to_bf16_kernel(const float* src, __nv_bfloat16* dst, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = __float2bfloat16_rn(src[i]);
}

// Block (t): out[t, :] = table[ids[t], :].
__global__ void embedding_kernel(const int32_t* ids, const __nv_bfloat16* table, int64_t d, float* out) {
  const int64_t t = blockIdx.x;
  const __nv_bfloat16* src = table + int64_t(ids[t]) * d;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) out[t * d + c] = __bfloat162float(src[c]);
}

// The sum of a value over the block's threads (every thread gets it): per warp by shuffles, then the warps' sums
// through shared memory. blockDim.x is a multiple of 32, at most 1024. Once per kernel: nothing fences warp_sums
// for a second call.
__device__ float block_sum(float x) {
  __shared__ float warp_sums[32];
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = x;
  __syncthreads();
  const unsigned lane = threadIdx.x % 32;  // every warp sums the warps' sums, so that every thread has the total
  x = lane < blockDim.x / 32 ? warp_sums[lane] : 0.0f;
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// Block (t): out[t, :] = x[t, :] / sqrt(mean(x[t, :]^2) + eps) * w, 4 columns per thread (d a multiple of 4; x,
// out 16-byte and w 8-byte aligned), a thread per 4 columns up to 1024 threads. The sum of squares is reduced in
// fp32 (block_sum). One block of 256 threads striding over a row of 4,096 took 15 us on an H200 (two latency-bound
// loops of 16 loads); batch-1 decode runs 65 of them a step.
__global__ void rmsnorm_kernel(const float4* x, const uint2* w, int d4, float eps, float4* out) {
  allow_dependents();
  wait_for_inputs();
  const float4* xr = x + int64_t(blockIdx.x) * d4;
  float4* o = out + int64_t(blockIdx.x) * d4;
  float sum_sq = 0.0f;
  for (int c = threadIdx.x; c < d4; c += blockDim.x) {
    const float4 a = xr[c];
    sum_sq += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
  }
  const float inv_rms = 1.0f / sqrtf(block_sum(sum_sq) / float(4 * d4) + eps);
  for (int c = threadIdx.x; c < d4; c += blockDim.x) {
    const float4 a = xr[c];
    const uint2 packed = w[c];
    const float2 w01 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&packed.x));
    const float2 w23 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&packed.y));
    o[c] = make_float4(a.x * inv_rms * w01.x, a.y * inv_rms * w01.y, a.z * inv_rms * w23.x, a.w * inv_rms * w23.y);
  }
}

__global__ void silu_mul_kernel(const float* gate, const float* up, int64_t n, float* out) {
  allow_dependents();
  wait_for_inputs();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) {
    const float g = gate[i];
    out[i] = g / (1.0f + expf(-g)) * up[i];
  }
}

__global__ void add_kernel(float* x, const float* y, int64_t n) {
  allow_dependents();
  wait_for_inputs();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] += y[i];
}

// Block (i): out[i, :] = x[rows[i], :].
__global__ void gather_rows_kernel(const float* x, const int64_t* rows, int64_t d, float* out) {
  const float* src = x + rows[blockIdx.x] * d;
  float* dst = out + int64_t(blockIdx.x) * d;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) dst[c] = src[c];
}

}  // namespace

void f32_to_bf16(CudaContext& ctx, const float* src, void* dst, int64_t n) {
  if (n == 0) return;
  f32_to_bf16_kernel<<<grid_for(n), kThreads, 0, ctx.stream()>>>(src, static_cast<__nv_bfloat16*>(dst), n);
  check(cudaGetLastError(), "f32_to_bf16_kernel");
}

void embedding(CudaContext& ctx, std::span<const int32_t> ids, const Tensor& table, Tensor& out) {
  const __nv_bfloat16* w = bf16_weight(table, "embedding");
  require_f32(out, "embedding", "out");
  require(out.cols == table.cols && out.rows >= int64_t(ids.size()),
          "embedding: out [" + std::to_string(out.rows) + ", " + std::to_string(out.cols) + "] cannot hold " +
              std::to_string(ids.size()) + " rows of " + std::to_string(table.cols));
  for (int32_t id : ids) {
    require(id >= 0 && id < table.rows, "embedding: token id " + std::to_string(id) + " is outside the table of " +
                                            std::to_string(table.rows) + " rows");
  }
  if (ids.empty()) return;
  embedding_kernel<<<unsigned(ids.size()), kRowThreads, 0, ctx.stream()>>>(ctx.upload(ids), w, table.cols,
                                                                             out.f32());
  check(cudaGetLastError(), "embedding_kernel");
}

void rmsnorm(CudaContext& ctx, const Tensor& x, const Tensor& w, float eps, Tensor& out) {
  const __nv_bfloat16* wd = bf16_weight(w, "rmsnorm");
  require_f32(x, "rmsnorm", "x");
  require_f32(out, "rmsnorm", "out");
  require(w.size() == x.cols && out.cols == x.cols && out.rows >= x.rows,
          "rmsnorm: x [" + std::to_string(x.rows) + ", " + std::to_string(x.cols) + "], w of " +
              std::to_string(w.size()) + " and out [" + std::to_string(out.rows) + ", " + std::to_string(out.cols) +
              "] do not match");
  require(x.cols % 4 == 0 && aligned(x.data, 16) && aligned(out.data, 16) && aligned(wd, 8),
          "rmsnorm: d_model " + std::to_string(x.cols) + " must be a multiple of 4, and x, out and w aligned");
  if (x.rows == 0) return;
  const int d4 = int(x.cols / 4);
  const int threads = std::min(1024, (d4 + 31) / 32 * 32);
  launch_overlapped(ctx, "rmsnorm_kernel", rmsnorm_kernel, unsigned(x.rows), threads, 0,
                    static_cast<const float4*>(x.data), reinterpret_cast<const uint2*>(wd), d4, eps,
                    static_cast<float4*>(out.data));
}

void silu_mul(CudaContext& ctx, const Tensor& gate, const Tensor& up, Tensor& out) {
  require_f32(gate, "silu_mul", "gate");
  require_f32(up, "silu_mul", "up");
  require_f32(out, "silu_mul", "out");
  require(up.size() == gate.size() && out.size() >= gate.size(), "silu_mul: gate, up and out sizes do not match");
  if (gate.size() == 0) return;
  launch_overlapped(ctx, "silu_mul_kernel", silu_mul_kernel, grid_for(gate.size()), kThreads, 0, gate.f32(),
                    up.f32(), gate.size(), out.f32());
}

void add(CudaContext& ctx, Tensor& x, const Tensor& y) {
  require_f32(x, "add", "x");
  require_f32(y, "add", "y");
  require(y.size() >= x.size(), "add: y is smaller than x");
  if (x.size() == 0) return;
  launch_overlapped(ctx, "add_kernel", add_kernel, grid_for(x.size()), kThreads, 0, x.f32(), y.f32(), x.size());
}

void gather_rows(CudaContext& ctx, const Tensor& x, std::span<const int64_t> rows, Tensor& out) {
  require_f32(x, "gather_rows", "x");
  require_f32(out, "gather_rows", "out");
  require(x.cols == out.cols && out.rows >= int64_t(rows.size()), "gather_rows: shapes do not match");
  for (int64_t r : rows) {
    require(r >= 0 && r < x.rows, "gather_rows: row " + std::to_string(r) + " is outside x's " +
                                      std::to_string(x.rows) + " rows");
  }
  if (rows.empty()) return;
  gather_rows_kernel<<<unsigned(rows.size()), kRowThreads, 0, ctx.stream()>>>(x.f32(), ctx.upload(rows), x.cols,
                                                                               out.f32());
  check(cudaGetLastError(), "gather_rows_kernel");
}

}  // namespace strata::cuda
