// Compaction of a layer's cache after a policy's selection, on CUDA (the CPU twin, kernels/cpu/kv_compaction.cpp,
// states the rules): entry kept[j] moves to entry j, in one KV head or in all of them.
//
// The destination blocks are the source blocks, so every compaction is two stream-ordered phases: a gather kernel
// copies the kept entries from the first one that changes into device scratch, then scatter kernels write them to
// their new places. No kernel reads what another thread of the same kernel writes.
// - A full-precision layer moves bf16 rows unchanged: grid (moved entries, heads), one thread per element of K|V.
// - A layer that starts with quantized blocks keeps compacted_quantized_blocks() of them. The gather dequantizes
//   keys (and values) to fp32 and keeps each quantized value's codes, scales and mins; the group scatter
//   re-quantizes the keys of every rewritten group per channel and writes values as codes again (copied when they
//   were codes, quantized when they were bf16); the full-precision scatter writes bf16.
// Work: O(entries from the first moved one) per KV head; scratch of that many keys and values.
#include <algorithm>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/kv_device.cuh"

namespace strata::cuda {
namespace {

constexpr int kThreads = 128;

// Full-precision moves. Grid (entries from `first`, heads), kThreads threads over the 2 x head_dim elements:
// record (i, head) of the scratch holds entry kept[first + i]'s K row then V row, raw bf16.
__global__ void gather_rows(const uint8_t* base, const int64_t* blocks, const int32_t* kept, int first, int h_begin,
                            __nv_bfloat16* scratch, KvGeometry g) {
  const int i = int(blockIdx.x), hh = int(blockIdx.y), head = h_begin + hh;
  const int entry = kept[first + i];
  const int slot = entry % g.block_size;
  const auto* from = reinterpret_cast<const __nv_bfloat16*>(base + blocks[entry / g.block_size]);
  __nv_bfloat16* record = scratch + (int64_t(i) * gridDim.y + hh) * 2 * g.head_dim;
  for (int c = int(threadIdx.x); c < 2 * g.head_dim; c += int(blockDim.x)) {
    // c < head_dim: key channel c; otherwise value channel c - head_dim.
    record[c] = c < g.head_dim ? from[g.k_element(head, slot) + c] : from[g.v_element(head, slot) + c - g.head_dim];
  }
}

// The inverse: record (i, head) goes to entry first + i.
__global__ void scatter_rows(uint8_t* base, const int64_t* blocks, int first, int h_begin,
                             const __nv_bfloat16* scratch, KvGeometry g) {
  const int i = int(blockIdx.x), hh = int(blockIdx.y), head = h_begin + hh;
  const int entry = first + i;
  const int slot = entry % g.block_size;
  auto* to = reinterpret_cast<__nv_bfloat16*>(base + blocks[entry / g.block_size]);
  const __nv_bfloat16* record = scratch + (int64_t(i) * gridDim.y + hh) * 2 * g.head_dim;
  for (int c = int(threadIdx.x); c < 2 * g.head_dim; c += int(blockDim.x)) {
    (c < g.head_dim ? to[g.k_element(head, slot) + c] : to[g.v_element(head, slot) + c - g.head_dim]) = record[c];
  }
}

// The kept entries from `first` on, per head, for a layer with quantized blocks: record(j, hh) holds entry
// kept[j] (entry j after compaction, j >= first) of head h_begin + hh.
struct Gathered {
  int first = 0;
  int h_begin = 0;
  int n_heads = 0;
  float* keys = nullptr;           // [records][head_dim], dequantized when they were codes
  float* values = nullptr;         // [records][head_dim], likewise
  int32_t* value_coded = nullptr;  // [records]: 1 when the value was quantized (its codes are below)
  uint8_t* v_codes = nullptr;      // [records][code_row_bytes]
  uint16_t* v_scales = nullptr;    // [records][v_groups], as stored (fp16)
  uint16_t* v_mins = nullptr;      // [records][v_groups]

  __device__ int64_t record(int j, int hh) const { return int64_t(j - first) * n_heads + hh; }
};

// Grid (kept entries from `first`, heads), kThreads threads over the channels. blocks[b] is the byte offset of
// table block b: quantized for b < n_quantized, full precision after.
__global__ void gather_entries(const uint8_t* base, const int64_t* blocks, int n_quantized, const int32_t* kept,
                               Gathered out, KvGeometry g) {
  const int hh = int(blockIdx.y), head = out.h_begin + hh;
  const int entry = kept[out.first + int(blockIdx.x)];
  const int b = entry / g.block_size, slot = entry % g.block_size;
  const int64_t r = out.record(out.first + int(blockIdx.x), hh);
  float* key = out.keys + r * g.head_dim;
  float* value = out.values + r * g.head_dim;
  if (b < n_quantized) {
    const uint8_t* q = base + blocks[b];
    for (int c = int(threadIdx.x); c < g.head_dim; c += int(blockDim.x)) {
      key[c] = dequantize_key(q, head, slot, c, g);
      value[c] = dequantize_value(q, head, slot, c, g);
    }
    for (int byte = int(threadIdx.x); byte < g.code_row_bytes; byte += int(blockDim.x)) {
      out.v_codes[r * g.code_row_bytes + byte] = q[g.v_codes(head, slot) + byte];
    }
    for (int group = int(threadIdx.x); group < g.v_groups; group += int(blockDim.x)) {
      out.v_scales[r * g.v_groups + group] = scales_at(q, g.v_scale(head, slot))[group];
      out.v_mins[r * g.v_groups + group] = scales_at(q, g.v_min(head, slot))[group];
    }
  } else {
    for (int c = int(threadIdx.x); c < g.head_dim; c += int(blockDim.x)) {
      key[c] = load_bf16(base, blocks[b], g.k_element(head, slot) + c);
      value[c] = load_bf16(base, blocks[b], g.v_element(head, slot) + c);
    }
  }
  if (threadIdx.x == 0) out.value_coded[r] = b < n_quantized;
}

// Grid (rewritten groups, heads), kThreads threads: group first_group + blockIdx.x (table block of the same index)
// receives entries [32 * group, 32 * group + 32). Keys are re-quantized per channel from the gathered fp32 keys;
// each value keeps its codes, or is quantized from its gathered bf16 value.
__global__ void scatter_groups(uint8_t* base, const int64_t* blocks, int first_group, Gathered in, KvGeometry g) {
  const int group = first_group + int(blockIdx.x);
  const int hh = int(blockIdx.y), head = in.h_begin + hh;
  const int entry0 = group * g.block_size;  // the group's first entry
  uint8_t* block = base + blocks[group];
  quantize_keys_strided([&](int t, int c) { return in.keys[in.record(entry0 + t, hh) * g.head_dim + c]; }, block,
                        head, g, int(threadIdx.x), int(blockDim.x));
  const int per_byte = 8 / g.bits;
  const int group_bytes = kKvQuantGroup / per_byte;  // code bytes of one value group
  for (int item = int(threadIdx.x); item < g.block_size * g.v_groups; item += int(blockDim.x)) {
    const int t = item / g.v_groups, vg = item % g.v_groups;
    const int64_t r = in.record(entry0 + t, hh);
    if (in.value_coded[r]) {
      for (int byte = vg * group_bytes; byte < (vg + 1) * group_bytes; ++byte) {
        block[g.v_codes(head, t) + byte] = in.v_codes[r * g.code_row_bytes + byte];
      }
      scales_at(block, g.v_scale(head, t))[vg] = in.v_scales[r * g.v_groups + vg];
      scales_at(block, g.v_min(head, t))[vg] = in.v_mins[r * g.v_groups + vg];
    } else {
      quantize_value_group([&](int c) { return in.values[r * g.head_dim + c]; }, block, head, t, vg, g);
    }
  }
}

// Grid (entries from first_full, heads), kThreads threads over the channels: entry first_full + blockIdx.x is
// full-precision entry (entry - 32 * kept_quantized) of the blocks after the table's n_quantized quantized ones.
__global__ void scatter_full(uint8_t* base, const int64_t* blocks, int n_quantized, int kept_quantized,
                             int first_full, Gathered in, KvGeometry g) {
  const int entry = first_full + int(blockIdx.x);
  const int hh = int(blockIdx.y), head = in.h_begin + hh;
  const int index = entry - kept_quantized * g.block_size;
  const int64_t block = blocks[n_quantized + index / g.block_size];
  const int slot = index % g.block_size;
  const int64_t r = in.record(entry, hh);
  for (int c = int(threadIdx.x); c < g.head_dim; c += int(blockDim.x)) {
    store_bf16(base, block, g.k_element(head, slot) + c, in.keys[r * g.head_dim + c]);
    store_bf16(base, block, g.v_element(head, slot) + c, in.values[r * g.head_dim + c]);
  }
}

void compact_full_precision(CudaContext& ctx, std::span<const int32_t> table, std::span<const int32_t> kept,
                            const KvPoolView& pool, int h_begin, int n_heads) {
  const KvGeometry g = geometry_of(pool.layout);
  const std::vector<int64_t> offsets = full_block_offsets(pool, table, "kv_compact");
  int first = 0;  // entries [0, first) stay where they are
  while (first < int(kept.size()) && kept[size_t(first)] == first) ++first;
  const int n = int(kept.size()) - first;
  if (n == 0) return;
  auto* scratch = static_cast<__nv_bfloat16*>(ctx.scratch(sizeof(__nv_bfloat16) * size_t(n) * size_t(n_heads) * 2 *
                                                          size_t(g.head_dim)));
  const int64_t* blocks = ctx.upload(offsets);
  auto* base = static_cast<uint8_t*>(pool.base);
  const dim3 grid{unsigned(n), unsigned(n_heads)};
  gather_rows<<<grid, kThreads, 0, ctx.stream()>>>(base, blocks, ctx.upload(kept), first, h_begin, scratch, g);
  check_launch("kv_compact (gather_rows)");
  scatter_rows<<<grid, kThreads, 0, ctx.stream()>>>(base, blocks, first, h_begin, scratch, g);
  check_launch("kv_compact (scatter_rows)");
}

void compact_quantized(CudaContext& ctx, std::span<const int32_t> table, std::span<const int32_t> kept,
                       const KvPoolView& pool, int h_begin, int n_heads, int n_quantized) {
  const KvBlockLayout& L = pool.layout;
  const KvGeometry g = geometry_of(L);
  const int bs = L.block_size;
  const int n_kept = int(kept.size());
  const int kept_quantized = compacted_quantized_blocks(n_quantized, n_kept);
  const int n_full = n_kept - kept_quantized * bs;
  if ((n_full + bs - 1) / bs > int(table.size()) - n_quantized) {
    throw std::invalid_argument("kv_compact: " + std::to_string(n_full) +
                                " kept entries need more full-precision blocks than the table has after its " +
                                std::to_string(n_quantized) + " quantized ones");
  }
  std::vector<int64_t> offsets(table.size());
  for (size_t b = 0; b < table.size(); ++b) {
    offsets[b] = int(b) < n_quantized ? quantized_block_offset(pool, table[b], "kv_compact")
                                      : full_block_offset(pool, table[b], "kv_compact");
  }
  // The same bounds as the CPU twin: groups before the first moved entry stay; full-precision entries before it
  // stay too unless quantized groups are given up (then the whole full-precision region shifts).
  int unmoved = 0;
  while (unmoved < n_kept && kept[size_t(unmoved)] == unmoved) ++unmoved;
  const int first_group = std::min(unmoved / bs, kept_quantized);
  const int first_full = kept_quantized == n_quantized ? std::max(unmoved, kept_quantized * bs) : kept_quantized * bs;
  const int first = std::min(first_group * bs, first_full);
  if (first >= n_kept) return;

  const size_t records = size_t(n_kept - first) * size_t(n_heads);
  Gathered gathered;
  gathered.first = first;
  gathered.h_begin = h_begin;
  gathered.n_heads = n_heads;
  gathered.keys = static_cast<float*>(ctx.scratch(sizeof(float) * records * size_t(g.head_dim)));
  gathered.values = static_cast<float*>(ctx.scratch(sizeof(float) * records * size_t(g.head_dim)));
  gathered.value_coded = static_cast<int32_t*>(ctx.scratch(sizeof(int32_t) * records));
  gathered.v_codes = static_cast<uint8_t*>(ctx.scratch(records * size_t(g.code_row_bytes)));
  gathered.v_scales = static_cast<uint16_t*>(ctx.scratch(sizeof(uint16_t) * records * size_t(g.v_groups)));
  gathered.v_mins = static_cast<uint16_t*>(ctx.scratch(sizeof(uint16_t) * records * size_t(g.v_groups)));
  const int64_t* blocks = ctx.upload(offsets);
  auto* base = static_cast<uint8_t*>(pool.base);

  gather_entries<<<dim3(unsigned(n_kept - first), unsigned(n_heads)), kThreads, 0, ctx.stream()>>>(
      base, blocks, n_quantized, ctx.upload(kept), gathered, g);
  check_launch("kv_compact (gather_entries)");
  if (kept_quantized > first_group) {
    scatter_groups<<<dim3(unsigned(kept_quantized - first_group), unsigned(n_heads)), kThreads, 0, ctx.stream()>>>(
        base, blocks, first_group, gathered, g);
    check_launch("kv_compact (scatter_groups)");
  }
  if (n_kept > first_full) {
    scatter_full<<<dim3(unsigned(n_kept - first_full), unsigned(n_heads)), kThreads, 0, ctx.stream()>>>(
        base, blocks, n_quantized, kept_quantized, first_full, gathered, g);
    check_launch("kv_compact (scatter_full)");
  }
}

}  // namespace

void kv_compact(CudaContext& ctx, std::span<const int32_t> block_table, std::span<const int32_t> kept,
                const KvPoolView& pool, int head) {
  require_bf16_pool(pool, "kv_compact");
  const KvBlockLayout& L = pool.layout;
  if (head >= L.n_kv_heads) {
    throw std::invalid_argument("kv_compact: KV head " + std::to_string(head) + " out of range");
  }
  const int64_t n_entries = int64_t(block_table.size()) * L.block_size;
  for (size_t j = 0; j < kept.size(); ++j) {
    if (kept[j] < 0 || kept[j] >= n_entries || (j > 0 && kept[j] <= kept[j - 1])) {
      throw std::invalid_argument("kv_compact: kept entries must be ascending and within the table's " +
                                  std::to_string(n_entries) + " entries (kept[" + std::to_string(j) +
                                  "] = " + std::to_string(kept[j]) + ")");
    }
  }
  const int h_begin = head < 0 ? 0 : head, n_heads = head < 0 ? L.n_kv_heads : 1;
  int n_quantized = 0;
  while (n_quantized < int(block_table.size()) && pool.is_quantized(block_table[size_t(n_quantized)])) ++n_quantized;
  if (n_quantized == 0) return compact_full_precision(ctx, block_table, kept, pool, h_begin, n_heads);

  require_quantized_pool(pool, "kv_compact");
  for (size_t b = size_t(n_quantized); b < block_table.size(); ++b) {
    if (pool.is_quantized(block_table[b])) {
      throw std::invalid_argument("kv_compact: quantized blocks must come before the full-precision ones");
    }
  }
  compact_quantized(ctx, block_table, kept, pool, h_begin, n_heads, n_quantized);
}

}  // namespace strata::cuda
