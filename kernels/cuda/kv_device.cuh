#pragma once
// What the CUDA KV-cache ops (kernels/cuda/kv_*.cu, pod_ops.cu, paged_attention.cu) share: the pool's geometry in
// a form kernels can read, the host-side resolution of block ids to byte offsets, bf16 access and KIVI's per-group
// arithmetic.
//
// Block ids are resolved on the host: every op turns its (host) block table into byte offsets from the pool's
// base, checking each id on the way, and uploads the offsets. Kernels then never interpret ids, and the formulas
// of kernels/kv_block_layout.h are used in exactly one place per quantity: KvGeometry takes the quantized-block
// offsets from KvBlockLayout itself and keeps only their per-head and per-entry strides here.
//
// The quantization arithmetic repeats kernels/cpu/kv_quantization.cpp operation by operation, with the rounding
// intrinsics that forbid fused multiply-adds (the CPU build has none), so that the same inputs give the same codes.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_context.h"
#include "kernels/kv_block_layout.h"

namespace strata::cuda {

// KvBlockLayout's numbers for device code (its member functions are host-only).
struct KvGeometry {
  int n_kv_heads = 0;
  int head_dim = 0;
  int block_size = 0;
  int bits = 0;    // 8, 4 or 2 in a quantized pool, 0 otherwise
  int levels = 0;  // the largest code, 2^bits - 1
  int v_groups = 0;
  int64_t region_elements = 0;  // one region (all heads' K, or all heads' V) of a full-precision block
  int64_t code_row_bytes = 0;
  int64_t codes_bytes = 0;      // the K codes (or the V codes) of a quantized block
  int64_t k_scale0 = 0, k_min0 = 0, v_scale0 = 0, v_min0 = 0;  // byte offsets of head 0 (entry 0)

  // Full-precision blocks, in bf16 elements from the block's start: [K | V] x [head][slot][head_dim].
  __host__ __device__ int64_t k_element(int head, int slot) const {
    return (int64_t(head) * block_size + slot) * head_dim;
  }
  __host__ __device__ int64_t v_element(int head, int slot) const { return region_elements + k_element(head, slot); }
  // Quantized blocks, in bytes from the block's start (KvBlockLayout's formulas, strides only).
  __host__ __device__ int64_t k_codes(int head, int slot) const {
    return (int64_t(head) * block_size + slot) * code_row_bytes;
  }
  __host__ __device__ int64_t v_codes(int head, int slot) const { return codes_bytes + k_codes(head, slot); }
  __host__ __device__ int64_t k_scale(int head) const { return k_scale0 + int64_t(head) * head_dim * kKvScaleBytes; }
  __host__ __device__ int64_t k_min(int head) const { return k_min0 + int64_t(head) * head_dim * kKvScaleBytes; }
  __host__ __device__ int64_t v_scale(int head, int slot) const {
    return v_scale0 + (int64_t(head) * block_size + slot) * v_groups * kKvScaleBytes;
  }
  __host__ __device__ int64_t v_min(int head, int slot) const {
    return v_min0 + (int64_t(head) * block_size + slot) * v_groups * kKvScaleBytes;
  }
};

inline KvGeometry geometry_of(const KvBlockLayout& L) {
  KvGeometry g;
  g.n_kv_heads = L.n_kv_heads;
  g.head_dim = L.head_dim;
  g.block_size = L.block_size;
  g.region_elements = int64_t(L.n_kv_heads) * L.block_size * L.head_dim;
  if (L.quant != KvQuant::none) {
    g.bits = kv_quant_bits(L.quant);
    g.levels = kv_quant_levels(L.quant);
    g.v_groups = L.v_groups();
    g.code_row_bytes = L.code_row_bytes();
    g.codes_bytes = L.codes_bytes();
    g.k_scale0 = L.k_scale_offset(0);
    g.k_min0 = L.k_min_offset(0);
    g.v_scale0 = L.v_scale_offset(0, 0);
    g.v_min0 = L.v_min_offset(0, 0);
  }
  return g;
}

// The CUDA pool's full-precision blocks are bf16; every op checks this first.
inline void require_bf16_pool(const KvPoolView& pool, const char* op) {
  if (pool.layout.dtype != DType::bf16) {
    throw std::invalid_argument(std::string(op) + ": the CUDA backend's KV pool holds bf16 blocks");
  }
  if (pool.base == nullptr) throw std::invalid_argument(std::string(op) + ": the pool view has no memory");
}

// Ops over one KV head check it first.
inline void require_head(const KvPoolView& pool, int head, const char* op) {
  if (head < 0 || head >= pool.layout.n_kv_heads) {
    throw std::invalid_argument(std::string(op) + ": KV head " + std::to_string(head) + " out of range");
  }
}

// KIVI's layout constraints (kernels/kv_block_layout.h), checked before anything touches a quantized block.
inline void require_quantized_pool(const KvPoolView& pool, const char* op) {
  const KvBlockLayout& L = pool.layout;
  if (L.quant == KvQuant::none) throw std::invalid_argument(std::string(op) + ": the pool is not quantized");
  if (L.block_size != kKvQuantGroup || L.head_dim % kKvQuantGroup != 0 || pool.n_slots <= 0) {
    throw std::invalid_argument(std::string(op) + ": quantized blocks need block_size " +
                                std::to_string(kKvQuantGroup) + ", a head_dim that is a multiple of it and n_slots");
  }
}

// Byte offset from the pool's base of full-precision block `id`. A view with n_slots 0 (bare memory) cannot say
// where the pool ends, so only the sign is checked there.
inline int64_t full_block_offset(const KvPoolView& pool, int32_t id, const char* op) {
  if (id < 0 || (pool.n_slots > 0 && id >= pool.n_slots) || pool.is_quantized(id)) {
    throw std::invalid_argument(std::string(op) + ": block " + std::to_string(id) +
                                " is not a full-precision block of the pool");
  }
  return int64_t(id) * pool.layout.block_bytes();
}

// Byte offset of quantized block `id`: sub-block q % per_slot of slot q / per_slot, q = id - n_slots.
inline int64_t quantized_block_offset(const KvPoolView& pool, int32_t id, const char* op) {
  const int per_slot = pool.layout.quantized_per_slot();
  if (!pool.is_quantized(id) || per_slot <= 0 || int64_t(id) - pool.n_slots >= int64_t(pool.n_slots) * per_slot) {
    throw std::invalid_argument(std::string(op) + ": block " + std::to_string(id) +
                                " is not a quantized block of the pool");
  }
  return static_cast<const uint8_t*>(pool.block_quantized(id)) - static_cast<const uint8_t*>(pool.base);
}

// Byte offset of coded block `id` (SpindleKV): sub-block q % per_slot of slot q / per_slot, q = id - n_slots.
inline int64_t coded_block_offset(const KvPoolView& pool, int32_t id, const char* op) {
  const int per_slot = pool.layout.coded_per_slot();
  if (!pool.is_coded(id) || per_slot <= 0 || int64_t(id) - pool.n_slots >= int64_t(pool.n_slots) * per_slot) {
    throw std::invalid_argument(std::string(op) + ": block " + std::to_string(id) + " is not a coded block of the pool");
  }
  return reinterpret_cast<const uint8_t*>(pool.block_coded(id)) - static_cast<const uint8_t*>(pool.base);
}

// The key RoPE of a pool (KvKeyRope) for device code: coded keys are rotated with it on read, and entries are
// un-rotated with it before they are coded. The table is the backend's device memory.
struct KeyRopeTable {
  const float* table = nullptr;  // [n_positions][head_dim]: cos of the pair's angle at i, sin at head_dim / 2 + i
  int n_positions = 0;
  bool interleaved = true;  // pairs (2i, 2i + 1); otherwise (i, i + head_dim / 2)
};

inline KeyRopeTable key_rope_of(const KvPoolView& pool) {
  return KeyRopeTable{pool.key_rope.table, pool.key_rope.n_positions, pool.key_rope.style == RopeStyle::interleaved};
}

// The offsets of a whole table of full-precision blocks.
inline std::vector<int64_t> full_block_offsets(const KvPoolView& pool, std::span<const int32_t> ids, const char* op) {
  std::vector<int64_t> offsets(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) offsets[i] = full_block_offset(pool, ids[i], op);
  return offsets;
}

// Raises the launch error of the kernel just queued (a bad configuration), naming it.
inline void check_launch(const char* kernel) { check(cudaGetLastError(), kernel); }

inline unsigned blocks_for(int64_t n, int threads) { return unsigned((n + threads - 1) / threads); }

__device__ inline float load_bf16(const uint8_t* base, int64_t block_offset, int64_t element) {
  return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(base + block_offset)[element]);
}
__device__ inline void store_bf16(uint8_t* base, int64_t block_offset, int64_t element, float x) {
  reinterpret_cast<__nv_bfloat16*>(base + block_offset)[element] = __float2bfloat16_rn(x);
}
// Stored scales and mins (fp16 bits) at a byte offset of a quantized block.
__device__ inline uint16_t* scales_at(uint8_t* p, int64_t offset) { return reinterpret_cast<uint16_t*>(p + offset); }
__device__ inline const uint16_t* scales_at(const uint8_t* p, int64_t offset) {
  return reinterpret_cast<const uint16_t*>(p + offset);
}
// The CPU's store_scale and load_scale: fp16 rounded to nearest even, saturated at +-kKvScaleMax, NaN kept.
__device__ inline uint16_t store_scale(float x) {
  return __half_as_ushort(__float2half_rn(x > kKvScaleMax ? kKvScaleMax : x < -kKvScaleMax ? -kKvScaleMax : x));
}
__device__ inline float load_scale(uint16_t stored) { return __half2float(__ushort_as_half(stored)); }

// Code c of a code row: 8 / bits channels a byte, the lowest channel in the lowest bits. Bits divide 8, so code c
// starts at bit c * bits of the row and never straddles two bytes (shifts, where c / (8 / bits) would divide).
__device__ inline int get_code(const uint8_t* row, int c, int bits) {
  const int bit = c * bits;
  return (row[bit >> 3] >> (bit & 7)) & ((1 << bits) - 1);
}

// fit_group + quantize_value of the CPU: scale = (max - min) / levels and min, each rounded to fp16 as stored, then
// code = round-half-even((x - min) / scale) with the rounded pair, clamped; a constant group has scale 0 and codes
// 0; NaN gives 0.
struct QuantGroup {
  float scale;
  float min;
};
__device__ inline QuantGroup fitted_group(float lo, float hi, int levels) {
  return QuantGroup{load_scale(store_scale(__fdiv_rn(__fsub_rn(hi, lo), float(levels)))), load_scale(store_scale(lo))};
}
__device__ inline int quantize_code(float x, QuantGroup g, int levels) {
  if (!(g.scale > 0.0f)) return 0;
  const float q = rintf(__fdiv_rn(__fsub_rn(x, g.min), g.scale));
  return q > 0.0f ? (q < float(levels) ? int(q) : levels) : 0;
}
__device__ inline float dequantize_code(int code, float scale, float min) {
  return __fadd_rn(min, __fmul_rn(float(code), scale));
}

// The byte of a code row that holds channels [first, first + per_byte), per_byte = 8 / bits, quantized with the
// groups `group_of(channel)` from values `x_of(channel)`. Whole bytes are written, so threads that own different
// bytes never race on a row of several codes a byte.
template <class Value, class Group>
__device__ inline uint8_t code_byte(int byte, int bits, int levels, Value x_of, Group group_of) {
  const int per_byte = 8 / bits;
  int packed = 0;
  for (int i = 0; i < per_byte; ++i) {
    const int c = byte * per_byte + i;
    packed |= quantize_code(x_of(c), group_of(c), levels) << (i * bits);
  }
  return uint8_t(packed);
}

// One head's keys of a quantized block from 32 fp32 entries key_of(t, c): per channel, the scale and min over the
// 32 entries, then the codes. Thread `tid` of `n_threads` owns code bytes tid, tid + n_threads, ... of every row
// (and the scales of their channels), so the block's threads together cover the head without races.
template <class Key>
__device__ void quantize_keys_strided(Key key_of, uint8_t* block, int head, const KvGeometry& g, int tid,
                                      int n_threads) {
  const int per_byte = 8 / g.bits;
  uint16_t* scale = scales_at(block, g.k_scale(head));
  uint16_t* min = scales_at(block, g.k_min(head));
  for (int byte = tid; byte < g.code_row_bytes; byte += n_threads) {
    for (int c = byte * per_byte; c < (byte + 1) * per_byte; ++c) {
      float lo = key_of(0, c), hi = lo;
      for (int t = 1; t < g.block_size; ++t) {
        const float x = key_of(t, c);
        lo = x < lo ? x : lo;  // std::min and std::max, as the CPU's fit_group
        hi = hi < x ? x : hi;
      }
      const QuantGroup q = fitted_group(lo, hi, g.levels);
      scale[c] = store_scale(q.scale);
      min[c] = store_scale(q.min);
    }
    for (int t = 0; t < g.block_size; ++t) {
      block[g.k_codes(head, t) + byte] = code_byte(
          byte, g.bits, g.levels, [&](int c) { return key_of(t, c); },
          [&](int c) { return QuantGroup{load_scale(scale[c]), load_scale(min[c])}; });
    }
  }
}

// Value group `group` (channels [32 * group, 32 * group + 32)) of entry `slot` of one head, from fp32 values
// value_of(c): the group's scale and min, then its codes (whole bytes: 32 channels are 32, 16 or 8 bytes).
template <class Value>
__device__ void quantize_value_group(Value value_of, uint8_t* block, int head, int slot, int group,
                                     const KvGeometry& g) {
  const int first = group * kKvQuantGroup;
  float lo = value_of(first), hi = lo;
  for (int c = first + 1; c < first + kKvQuantGroup; ++c) {
    const float x = value_of(c);
    lo = x < lo ? x : lo;
    hi = hi < x ? x : hi;
  }
  const QuantGroup q = fitted_group(lo, hi, g.levels);
  scales_at(block, g.v_scale(head, slot))[group] = store_scale(q.scale);
  scales_at(block, g.v_min(head, slot))[group] = store_scale(q.min);
  const int per_byte = 8 / g.bits;
  uint8_t* row = block + g.v_codes(head, slot);
  for (int byte = first / per_byte; byte < (first + kKvQuantGroup) / per_byte; ++byte) {
    row[byte] = code_byte(byte, g.bits, g.levels, value_of, [&](int) { return q; });
  }
}

__device__ inline float dequantize_key(const uint8_t* block, int head, int slot, int c, const KvGeometry& g) {
  return dequantize_code(get_code(block + g.k_codes(head, slot), c, g.bits),
                         load_scale(scales_at(block, g.k_scale(head))[c]),
                         load_scale(scales_at(block, g.k_min(head))[c]));
}
__device__ inline float dequantize_value(const uint8_t* block, int head, int slot, int c, const KvGeometry& g) {
  const int group = c / kKvQuantGroup;
  return dequantize_code(get_code(block + g.v_codes(head, slot), c, g.bits),
                         load_scale(scales_at(block, g.v_scale(head, slot))[group]),
                         load_scale(scales_at(block, g.v_min(head, slot))[group]));
}

// ---- SpindleKV's coded entries -------------------------------------------------------------------------------
// The arithmetic repeats kernels/cpu/kv_codebook.cpp operation by operation, without fused multiply-adds (the CPU
// build has none), so that the same inputs give the same bits on both backends.

// Channel c of x rotated by RoPE at `position` (sign 1) or back (sign -1), from the channel's pair: x_a and x_b are
// x at the pair's two channels a < b (rope_pair), the CPU's rotate().
__device__ inline void rope_pair(const KeyRopeTable& rope, int head_dim, int c, int& a, int& b, int& i) {
  const int half = head_dim / 2;
  i = rope.interleaved ? c / 2 : c % half;
  a = rope.interleaved ? 2 * i : i;
  b = rope.interleaved ? 2 * i + 1 : i + half;
}
__device__ inline float rope_channel(const KeyRopeTable& rope, int head_dim, int32_t position, float sign, int c,
                                     float x_a, float x_b) {
  int a, b, i;
  rope_pair(rope, head_dim, c, a, b, i);
  // Positions are checked on the host where rows are written (kv_codebook_encode); the clamp only keeps a corrupt
  // row from reading outside the table.
  position = min(max(position, 0), rope.n_positions - 1);
  const float* row = rope.table + int64_t(position) * head_dim;
  const float cos = row[i], sin = __fmul_rn(sign, row[head_dim / 2 + i]);
  return c == a ? __fsub_rn(__fmul_rn(x_a, cos), __fmul_rn(x_b, sin))
                : __fadd_rn(__fmul_rn(x_b, cos), __fmul_rn(x_a, sin));
}

// Codebook vector `vector`: head_dim fp32 values at float offset vector * head_dim of the pool, whatever its dtype.
__device__ inline const float* codebook_vector(const uint8_t* pool, int32_t vector, int head_dim) {
  return reinterpret_cast<const float*>(pool) + int64_t(vector) * head_dim;
}
// The code row of (head, slot) in the coded block at byte offset `block`.
__device__ inline const KvCodeRow& code_row(const uint8_t* pool, int64_t block, const KvGeometry& g, int head,
                                            int slot) {
  return reinterpret_cast<const KvCodeRow*>(pool + block)[int64_t(head) * g.block_size + slot];
}
// Channel c of a coded key, RoPE(k_magnitude * C[k_vector], position), and of a coded value,
// v_magnitude * C[v_vector]: what the CPU's attention reads (coded_key).
__device__ inline float coded_key_channel(const uint8_t* pool, const KvCodeRow& row, const KeyRopeTable& rope,
                                          int head_dim, int c) {
  int a, b, i;
  rope_pair(rope, head_dim, c, a, b, i);
  const float* v = codebook_vector(pool, row.k_vector, head_dim);
  return rope_channel(rope, head_dim, row.position, 1.0f, c, __fmul_rn(row.k_magnitude, v[a]),
                      __fmul_rn(row.k_magnitude, v[b]));
}
__device__ inline float coded_value_channel(const uint8_t* pool, const KvCodeRow& row, int head_dim, int c) {
  return __fmul_rn(row.v_magnitude, codebook_vector(pool, row.v_vector, head_dim)[c]);
}

// The sum of x over a warp, in every lane.
__device__ inline float warp_sum(float x) {
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

}  // namespace strata::cuda
