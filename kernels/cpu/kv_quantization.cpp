// KIVI group quantization of KV blocks on the CPU: the per-group arithmetic, the seal of full-precision blocks
// into quantized ones (kv_quantize) and the way back (kv_dequantize). Work per block and KV head: a pass over
// 2 x 32 x head_dim floats and as many codes.
#include "kernels/cpu/kv_quantization.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/kv_rows.h"
#include "kernels/cpu/quantized_dot.h"
#include "kernels/cpu/simd_clones.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/weight_format.h"

namespace strata::cpu {
namespace {

uint16_t* scales_at(uint8_t* block, int64_t offset) { return reinterpret_cast<uint16_t*>(block + offset); }
const uint16_t* scales_at(const uint8_t* block, int64_t offset) {
  return reinterpret_cast<const uint16_t*>(block + offset);
}

// Channel c of a code row: 8 / bits channels a byte, the lowest channel in the lowest bits.
void put_code(uint8_t* row, int c, int code, KvQuant quant) {
  const int bits = kv_quant_bits(quant), per_byte = 8 / bits, shift = (c % per_byte) * bits;
  const int mask = kv_quant_levels(quant) << shift;
  row[c / per_byte] = uint8_t((row[c / per_byte] & ~mask) | (code << shift));
}

void require_quantized_pool(const KvPoolView& pool, const char* op) {
  const KvBlockLayout& L = pool.layout;
  if (L.quant == KvQuant::none) throw std::invalid_argument(std::string(op) + ": the pool is not quantized");
  if (L.block_size != kKvQuantGroup || L.head_dim % kKvQuantGroup != 0) {
    throw std::invalid_argument(std::string(op) + ": quantized blocks need block_size " +
                                std::to_string(kKvQuantGroup) + " and a head_dim that is a multiple of it");
  }
}

void require_pairs(std::span<const int32_t> src, std::span<const int32_t> dst, const KvPoolView& pool,
                   bool src_quantized, const char* op) {
  if (src.size() != dst.size()) throw std::invalid_argument(std::string(op) + ": one destination per source block");
  for (size_t i = 0; i < src.size(); ++i) {
    if (pool.is_quantized(src[i]) != src_quantized || pool.is_quantized(dst[i]) == src_quantized) {
      throw std::invalid_argument(std::string(op) + ": block pair " + std::to_string(i) + " (" +
                                  std::to_string(src[i]) + " -> " + std::to_string(dst[i]) +
                                  ") does not go between the two formats");
    }
  }
}

// The bodies of dequantize_keys and dequantize_values for one code width. The width is a constant, so the loops
// over a row's bytes vectorise; `omp simd` says that the rows written do not overlap the bytes read.
template <int kBits>
[[gnu::always_inline]] inline void dequantize_keys(const uint8_t* block, int head, int first, int n,
                                                   const KvBlockLayout& L, float* out) {
  constexpr int kPerByte = 8 / kBits, kMask = (1 << kBits) - 1, kChunk = 64;
  const uint16_t* scale = scales_at(block, L.k_scale_offset(head));
  const uint16_t* min = scales_at(block, L.k_min_offset(head));
  for (int c0 = 0; c0 < L.head_dim; c0 += kChunk) {  // a chunk's scales and mins as floats, on the stack
    const int m = std::min(kChunk, L.head_dim - c0);
    float s[kChunk], b[kChunk];
    for (int c = 0; c < m; ++c) {
      s[c] = load_scale(scale[c0 + c]);
      b[c] = load_scale(min[c0 + c]);
    }
    for (int t = 0; t < n; ++t) {
      const uint8_t* row = block + L.k_codes_offset(head, first + t) + c0 / kPerByte;
      float* o = out + int64_t(t) * L.head_dim + c0;
#pragma omp simd
      for (int i = 0; i < m / kPerByte; ++i) {
        for (int k = 0; k < kPerByte; ++k) {
          const int c = i * kPerByte + k;
          o[c] = b[c] + float((row[i] >> (k * kBits)) & kMask) * s[c];
        }
      }
    }
  }
}

template <int kBits>
[[gnu::always_inline]] inline void dequantize_values(const uint8_t* block, int head, int first, int n,
                                                     const KvBlockLayout& L, float* out) {
  constexpr int kPerByte = 8 / kBits, kMask = (1 << kBits) - 1, kGroupBytes = kKvQuantGroup / kPerByte;
  constexpr int kChunk = 64;
  // A head's entries keep their groups' scales one after another, entry by entry, as they do their mins: group
  // p % groups of entry p / groups is number p of both, and kChunk of them are converted at a time.
  const int groups = L.v_groups(), n_groups = n * groups;
  const uint16_t* scale = scales_at(block, L.v_scale_offset(head, first));
  const uint16_t* min = scales_at(block, L.v_min_offset(head, first));
  for (int p0 = 0; p0 < n_groups; p0 += kChunk) {
    const int m = std::min(kChunk, n_groups - p0);
    float s[kChunk], b[kChunk];
    for (int i = 0; i < m; ++i) {
      s[i] = load_scale(scale[p0 + i]);
      b[i] = load_scale(min[p0 + i]);
    }
    for (int i = 0; i < m; ++i) {
      const int t = (p0 + i) / groups, g = (p0 + i) % groups;
      const uint8_t* r = block + L.v_codes_offset(head, first + t) + g * kGroupBytes;
      float* o = out + int64_t(t) * L.head_dim + g * kKvQuantGroup;
      const float scale_g = s[i], min_g = b[i];
#pragma omp simd
      for (int j = 0; j < kGroupBytes; ++j) {
        for (int k = 0; k < kPerByte; ++k) o[j * kPerByte + k] = min_g + float((r[j] >> (k * kBits)) & kMask) * scale_g;
      }
    }
  }
}

}  // namespace

uint16_t store_scale(float x) {
  // Written so that NaN passes through (as a NaN) rather than being clamped.
  return fp32_to_fp16(x > kKvScaleMax ? kKvScaleMax : x < -kKvScaleMax ? -kKvScaleMax : x);
}

QuantGroup fit_group(const float* x, int n, int64_t stride, int levels) {
  float lo = x[0], hi = x[0];
  for (int i = 1; i < n; ++i) {
    lo = std::min(lo, x[i * stride]);
    hi = std::max(hi, x[i * stride]);
  }
  return QuantGroup{load_scale(store_scale((hi - lo) / float(levels))), load_scale(store_scale(lo))};
}

int quantize_value(float x, const QuantGroup& g, int levels) {
  if (!(g.scale > 0.0f)) return 0;
  const float q = std::nearbyint((x - g.min) / g.scale);
  // Written so that NaN gives 0 rather than an undefined conversion.
  return q > 0.0f ? (q < float(levels) ? int(q) : levels) : 0;
}

void quantize_keys(const float* k, int64_t stride, uint8_t* block, int head, const KvBlockLayout& L) {
  const int levels = kv_quant_levels(L.quant);
  uint16_t* scale = scales_at(block, L.k_scale_offset(head));
  uint16_t* min = scales_at(block, L.k_min_offset(head));
  for (int c = 0; c < L.head_dim; ++c) {
    const QuantGroup g = fit_group(k + c, L.block_size, stride, levels);
    scale[c] = store_scale(g.scale);
    min[c] = store_scale(g.min);
    for (int t = 0; t < L.block_size; ++t) {
      put_code(block + L.k_codes_offset(head, t), c, quantize_value(k[t * stride + c], g, levels), L.quant);
    }
  }
}

void quantize_value_row(const float* v, uint8_t* block, int head, int slot, const KvBlockLayout& L) {
  const int levels = kv_quant_levels(L.quant);
  uint16_t* scale = scales_at(block, L.v_scale_offset(head, slot));
  uint16_t* min = scales_at(block, L.v_min_offset(head, slot));
  uint8_t* row = block + L.v_codes_offset(head, slot);
  for (int g = 0; g < L.v_groups(); ++g) {
    const float* x = v + g * kKvQuantGroup;
    const QuantGroup group = fit_group(x, kKvQuantGroup, 1, levels);
    scale[g] = store_scale(group.scale);
    min[g] = store_scale(group.min);
    for (int c = 0; c < kKvQuantGroup; ++c) {
      put_code(row, g * kKvQuantGroup + c, quantize_value(x[c], group, levels), L.quant);
    }
  }
}

STRATA_SIMD_CLONES
void dequantize_keys(const uint8_t* block, int head, int first, int n, const KvBlockLayout& L, float* out) {
#if STRATA_QUANTIZED_DOT_X86
  if (L.quant != KvQuant::none && best_cpu_isa() >= CpuIsa::avx2) {
    return dequantize_keys_avx2(block, head, first, n, L, out);
  }
#endif
  switch (L.quant) {
    case KvQuant::int8: return dequantize_keys<8>(block, head, first, n, L, out);
    case KvQuant::int4: return dequantize_keys<4>(block, head, first, n, L, out);
    case KvQuant::int2: return dequantize_keys<2>(block, head, first, n, L, out);
    case KvQuant::none: break;
  }
  throw std::logic_error("dequantize_keys: the pool is not quantized");
}

STRATA_SIMD_CLONES
void dequantize_values(const uint8_t* block, int head, int first, int n, const KvBlockLayout& L, float* out) {
#if STRATA_QUANTIZED_DOT_X86
  if (L.quant != KvQuant::none && best_cpu_isa() >= CpuIsa::avx2) {
    return dequantize_values_avx2(block, head, first, n, L, out);
  }
#endif
  switch (L.quant) {
    case KvQuant::int8: return dequantize_values<8>(block, head, first, n, L, out);
    case KvQuant::int4: return dequantize_values<4>(block, head, first, n, L, out);
    case KvQuant::int2: return dequantize_values<2>(block, head, first, n, L, out);
    case KvQuant::none: break;
  }
  throw std::logic_error("dequantize_values: the pool is not quantized");
}

void copy_value_entry(const uint8_t* src_block, int src_slot, uint8_t* dst_block, int dst_slot, int head,
                      const KvBlockLayout& L) {
  std::memmove(dst_block + L.v_codes_offset(head, dst_slot), src_block + L.v_codes_offset(head, src_slot),
               size_t(L.code_row_bytes()));
  std::memmove(dst_block + L.v_scale_offset(head, dst_slot), src_block + L.v_scale_offset(head, src_slot),
               size_t(kKvScaleBytes) * size_t(L.v_groups()));
  std::memmove(dst_block + L.v_min_offset(head, dst_slot), src_block + L.v_min_offset(head, src_slot),
               size_t(kKvScaleBytes) * size_t(L.v_groups()));
}

void kv_quantize(std::span<const int32_t> src, std::span<const int32_t> dst, const KvPoolView& pool) {
  require_quantized_pool(pool, "kv_quantize");
  require_pairs(src, dst, pool, /*src_quantized=*/false, "kv_quantize");
  const KvBlockLayout& L = pool.layout;
  // One item per (block, KV head).
  parallel_for(int64_t(src.size()) * L.n_kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> rows(size_t(L.block_size) * L.head_dim);  // one head's keys, then its values, as fp32
    for (int64_t item = begin; item < end; ++item) {
      const size_t i = size_t(item / L.n_kv_heads);
      const int h = int(item % L.n_kv_heads);
      uint8_t* to = pool.block_quantized(dst[i]);
      read_kv_rows(pool, src[i], L.k_offset(h, 0), int64_t(rows.size()), rows.data());
      quantize_keys(rows.data(), L.head_dim, to, h, L);
      read_kv_rows(pool, src[i], L.v_offset(h, 0), int64_t(rows.size()), rows.data());
      for (int t = 0; t < L.block_size; ++t) quantize_value_row(rows.data() + t * L.head_dim, to, h, t, L);
    }
  });
}

void kv_dequantize(std::span<const int32_t> src, std::span<const int32_t> dst, const KvPoolView& pool) {
  require_quantized_pool(pool, "kv_dequantize");
  require_pairs(src, dst, pool, /*src_quantized=*/true, "kv_dequantize");
  const KvBlockLayout& L = pool.layout;
  parallel_for(int64_t(src.size()) * L.n_kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> rows(size_t(L.block_size) * L.head_dim);
    for (int64_t item = begin; item < end; ++item) {
      const size_t i = size_t(item / L.n_kv_heads);
      const int h = int(item % L.n_kv_heads);
      const uint8_t* from = pool.block_quantized(src[i]);
      dequantize_keys(from, h, 0, L.block_size, L, rows.data());
      write_kv_rows(pool, dst[i], L.k_offset(h, 0), rows.data(), int64_t(rows.size()));
      dequantize_values(from, h, 0, L.block_size, L, rows.data());
      write_kv_rows(pool, dst[i], L.v_offset(h, 0), rows.data(), int64_t(rows.size()));
    }
  });
}

}  // namespace strata::cpu
