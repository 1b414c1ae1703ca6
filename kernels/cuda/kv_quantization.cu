// KIVI group quantization of KV blocks on CUDA (kernels/kv_block_layout.h has the format; the CPU twin is
// kernels/cpu/kv_quantization.cpp): the seal of bf16 staging blocks into quantized blocks (kv_quantize) and the
// way back (kv_dequantize). fp32 arithmetic throughout; the per-group operations are kv_device.cuh's.
// Work per block and KV head: 2 x 32 x head_dim bf16 elements read (written) and as many codes written (read).
#include <string>
#include <vector>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/kv_device.cuh"

namespace strata::cuda {
namespace {

constexpr int kThreads = 128;

// Grid (pairs, KV heads), kThreads threads. The block's threads first own the code bytes of the keys (the channels
// of one code byte each: per-channel groups over the 32 entries), then the (entry, value group) items: disjoint
// bytes of the destination, so no synchronisation is needed.
__global__ void quantize_blocks(uint8_t* base, const int64_t* src, const int64_t* dst, KvGeometry g) {
  const int pair = blockIdx.x, head = blockIdx.y;
  const int64_t from = src[pair];
  uint8_t* to = base + dst[pair];
  quantize_keys_strided([&](int t, int c) { return load_bf16(base, from, g.k_element(head, t) + c); }, to, head, g,
                        int(threadIdx.x), int(blockDim.x));
  for (int item = int(threadIdx.x); item < g.block_size * g.v_groups; item += int(blockDim.x)) {
    const int slot = item / g.v_groups, group = item % g.v_groups;
    quantize_value_group([&](int c) { return load_bf16(base, from, g.v_element(head, slot) + c); }, to, head, slot,
                         group, g);
  }
}

// Grid (pairs, KV heads), kThreads threads; thread item i is (entry i / head_dim, channel i % head_dim), so
// consecutive threads write consecutive bf16 elements.
__global__ void dequantize_blocks(uint8_t* base, const int64_t* src, const int64_t* dst, KvGeometry g) {
  const int pair = blockIdx.x, head = blockIdx.y;
  const uint8_t* from = base + src[pair];
  for (int item = int(threadIdx.x); item < g.block_size * g.head_dim; item += int(blockDim.x)) {
    const int slot = item / g.head_dim, c = item % g.head_dim;
    store_bf16(base, dst[pair], g.k_element(head, slot) + c, dequantize_key(from, head, slot, c, g));
    store_bf16(base, dst[pair], g.v_element(head, slot) + c, dequantize_value(from, head, slot, c, g));
  }
}

// Converts block src[i] into block dst[i] for every i: seals bf16 blocks into quantized ones (src_quantized
// false) or opens quantized blocks into bf16 ones, after checking that every pair goes between the two formats.
void convert_blocks(CudaContext& ctx, std::span<const int32_t> src, std::span<const int32_t> dst,
                    const KvPoolView& pool, bool src_quantized, const char* op) {
  require_bf16_pool(pool, op);
  require_quantized_pool(pool, op);
  if (src.size() != dst.size()) throw std::invalid_argument(std::string(op) + ": one destination per source block");
  auto offset = [&](int32_t id, bool quantized) {
    return quantized ? quantized_block_offset(pool, id, op) : full_block_offset(pool, id, op);
  };
  std::vector<int64_t> from, to;
  for (size_t i = 0; i < src.size(); ++i) {
    from.push_back(offset(src[i], src_quantized));
    to.push_back(offset(dst[i], !src_quantized));
  }
  if (from.empty()) return;
  const dim3 grid(unsigned(from.size()), unsigned(pool.layout.n_kv_heads));
  auto* kernel = src_quantized ? dequantize_blocks : quantize_blocks;
  kernel<<<grid, kThreads, 0, ctx.stream()>>>(static_cast<uint8_t*>(pool.base), ctx.upload(from), ctx.upload(to),
                                               geometry_of(pool.layout));
  check_launch(op);
}

}  // namespace

void kv_quantize(CudaContext& ctx, std::span<const int32_t> src, std::span<const int32_t> dst,
                 const KvPoolView& pool) {
  convert_blocks(ctx, src, dst, pool, /*src_quantized=*/false, "kv_quantize");
}

void kv_dequantize(CudaContext& ctx, std::span<const int32_t> src, std::span<const int32_t> dst,
                   const KvPoolView& pool) {
  convert_blocks(ctx, src, dst, pool, /*src_quantized=*/true, "kv_dequantize");
}

}  // namespace strata::cuda
