// Expected Attention's reads of the cache on CUDA (the CPU twin is kernels/cpu/kv_key_forms.cpp): for the first n
// entries of a KV head, m quadratic forms of each key, linear[j] . k + k^T Q_j k, and each value's norm, over bf16
// full-precision and KIVI-quantized blocks, in fp32. Work per entry: m (head_dim^2 + head_dim) multiply-adds; the
// m x head_dim x head_dim matrices are read once per 32 entries (from L2 after the first block).
#include <string>
#include <vector>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/kv_device.cuh"

namespace strata::cuda {
namespace {

constexpr int kEntries = 32;   // entries a thread block takes: each thread keeps a sum per entry in registers
constexpr int kMaxWarps = 8;  // head_dim up to 256, a thread per channel (32 KiB of keys: no opt-in needed)

// blocks[] holds the table's byte offsets, a quantized block's as ~offset (paged_attention's encoding).
__device__ inline float entry_channel(const uint8_t* base, const int64_t* blocks, int entry, int head, bool key,
                                      int c, const KvGeometry& g) {
  const int64_t block = blocks[entry / g.block_size];
  const int slot = entry % g.block_size;
  if (block < 0) {
    const uint8_t* q = base + ~block;
    return key ? dequantize_key(q, head, slot, c, g) : dequantize_value(q, head, slot, c, g);
  }
  return load_bf16(base, block, key ? g.k_element(head, slot) + c : g.v_element(head, slot) + c);
}

// Grid ceil(n / kEntries), head_dim rounded up to whole warps of threads, head_dim x kEntries floats of dynamic
// shared memory (the block's keys, channel-major, so that a thread reads 4 entries' channel i as one float4).
// Thread c computes, for each of the block's entries, u_c = sum_i Q_j[i][c] k_i (reading column c of Q_j: the
// threads' reads of a row are adjacent), then k_c (u_c + linear_j[c]); the sum of that over the threads is
// k^T Q_j k + linear_j . k, the CPU's form summed in another order.
__global__ void key_forms_kernel(const uint8_t* base, const int64_t* blocks, int n, int head, const float* linear,
                                 const float* quadratic, int m, float* forms, float* value_norms, KvGeometry g) {
  extern __shared__ float4 shared[];
  float* keys = reinterpret_cast<float*>(shared);  // [head_dim][kEntries]
  __shared__ float partial[kMaxWarps][kEntries];
  const int d = g.head_dim, first = int(blockIdx.x) * kEntries, count = min(kEntries, n - first);
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, n_warps = int(blockDim.x) / 32;
  // Adjacent threads read adjacent channels of one key; their stores kEntries floats apart share a bank, once.
  for (int i = int(threadIdx.x); i < d * kEntries; i += int(blockDim.x)) {
    const int t = i / d, c = i % d;
    keys[c * kEntries + t] = t < count ? entry_channel(base, blocks, first + t, head, true, c, g) : 0.0f;
  }
  for (int t = warp; t < count; t += n_warps) {
    float sq = 0.0f;
    for (int c = lane; c < d; c += 32) {
      const float v = entry_channel(base, blocks, first + t, head, false, c, g);
      sq += v * v;
    }
    sq = warp_sum(sq);
    if (lane == 0) value_norms[first + t] = sqrtf(sq);
  }
  __syncthreads();

  const int c = int(threadIdx.x);
  for (int j = 0; j < m; ++j) {
    float acc[kEntries];
#pragma unroll
    for (int t = 0; t < kEntries; ++t) acc[t] = 0.0f;
    if (c < d) {
      const float* column = quadratic + int64_t(j) * d * d + c;
      for (int i = 0; i < d; ++i) {
        const float q = __ldg(column + int64_t(i) * d);
        const float4* k = reinterpret_cast<const float4*>(keys + i * kEntries);
#pragma unroll
        for (int t4 = 0; t4 < kEntries / 4; ++t4) {
          const float4 k4 = k[t4];
          acc[4 * t4] += q * k4.x;
          acc[4 * t4 + 1] += q * k4.y;
          acc[4 * t4 + 2] += q * k4.z;
          acc[4 * t4 + 3] += q * k4.w;
        }
      }
      const float l = __ldg(linear + j * d + c);
#pragma unroll
      for (int t = 0; t < kEntries; ++t) acc[t] = keys[c * kEntries + t] * (acc[t] + l);
    }
#pragma unroll
    for (int t = 0; t < kEntries; ++t) {
      const float s = warp_sum(acc[t]);
      if (lane == 0) partial[warp][t] = s;
    }
    __syncthreads();
    if (c < count) {
      float form = 0.0f;
      for (int w = 0; w < n_warps; ++w) form += partial[w][c];
      forms[int64_t(j) * n + first + c] = form;
    }
    __syncthreads();  // partial is written again by the next form
  }
}

// The encoded offsets of the blocks that hold entries [0, n).
std::vector<int64_t> resolve_blocks(const KvPoolView& pool, std::span<const int32_t> block_table, int64_t n) {
  const int64_t n_blocks = (n + pool.layout.block_size - 1) / pool.layout.block_size;
  std::vector<int64_t> blocks;
  for (int64_t b = 0; b < n_blocks; ++b) {
    const int32_t id = block_table[size_t(b)];
    if (pool.is_coded(id)) throw std::invalid_argument("kv_key_forms: codebook-coded blocks are not read");
    if (pool.is_quantized(id)) {
      require_quantized_pool(pool, "kv_key_forms");
      blocks.push_back(~quantized_block_offset(pool, id, "kv_key_forms"));
    } else {
      blocks.push_back(full_block_offset(pool, id, "kv_key_forms"));
    }
  }
  return blocks;
}

}  // namespace

void kv_key_forms(CudaContext& ctx, std::span<const int32_t> block_table, int head, std::span<const float> linear,
                  std::span<const float> quadratic, const KvPoolView& pool, std::span<float> forms,
                  std::span<float> value_norms) {
  require_bf16_pool(pool, "kv_key_forms");
  require_head(pool, head, "kv_key_forms");
  const int d = pool.layout.head_dim;
  const int64_t n = int64_t(value_norms.size());
  if (d > 32 * kMaxWarps || d % 4 != 0) {
    throw std::invalid_argument("kv_key_forms: head_dim " + std::to_string(d) + " is not a multiple of 4 up to " +
                                std::to_string(32 * kMaxWarps));
  }
  if (linear.size() % size_t(d) != 0) throw std::invalid_argument("kv_key_forms: linear is not [m][head_dim]");
  const int64_t m = int64_t(linear.size()) / d;
  if (int64_t(quadratic.size()) != m * d * d || int64_t(forms.size()) != m * n) {
    throw std::invalid_argument("kv_key_forms: quadratic [m][head_dim][head_dim] and forms [m][entries] expected");
  }
  if (n > int64_t(block_table.size()) * pool.layout.block_size) {
    throw std::invalid_argument("kv_key_forms: more entries than the block table holds");
  }
  if (n > INT32_MAX / (m > 0 ? m : 1)) throw std::invalid_argument("kv_key_forms: too many entries");
  const std::vector<int64_t> blocks = resolve_blocks(pool, block_table, n);
  if (n == 0) return;

  auto* device_norms = static_cast<float*>(ctx.scratch(sizeof(float) * size_t((m + 1) * n)));
  float* device_forms = device_norms + n;
  const unsigned threads = unsigned((d + 31) / 32 * 32);
  key_forms_kernel<<<blocks_for(n, kEntries), threads, sizeof(float) * size_t(d) * kEntries, ctx.stream()>>>(
      static_cast<const uint8_t*>(pool.base), ctx.upload(blocks), int(n), head, ctx.upload(linear),
      ctx.upload(quadratic), int(m), device_forms, device_norms, geometry_of(pool.layout));
  check_launch("kv_key_forms (key_forms_kernel)");
  ctx.download(device_norms, value_norms.data(), value_norms.size_bytes());
  ctx.download(device_forms, forms.data(), forms.size_bytes());
}

}  // namespace strata::cuda
