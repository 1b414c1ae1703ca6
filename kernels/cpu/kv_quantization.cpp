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

// The first n codes of a row as floats. per_byte is a constant, so the compiler turns the divisions into shifts:
// unpacking is the inner loop of attention over quantized blocks.
template <int kBits>
void unpack_row(const uint8_t* row, int n, float* out) {
  constexpr int per_byte = 8 / kBits, mask = (1 << kBits) - 1;
  for (int byte = 0; byte < n / per_byte; ++byte) {
    const int b = row[byte];
    for (int i = 0; i < per_byte; ++i) out[byte * per_byte + i] = float((b >> (i * kBits)) & mask);
  }
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

}  // namespace

uint16_t store_scale(float x) {
  // Written so that NaN passes through (as a NaN) rather than being clamped.
  return fp32_to_fp16(x > kKvScaleMax ? kKvScaleMax : x < -kKvScaleMax ? -kKvScaleMax : x);
}

float load_scale(uint16_t stored) { return fp16_to_fp32(stored); }

void load_scales(const uint8_t* at, int n, float* out) {
  const auto* stored = reinterpret_cast<const uint16_t*>(at);
  for (int i = 0; i < n; ++i) out[i] = load_scale(stored[i]);
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

void unpack_codes(const uint8_t* row, const KvBlockLayout& L, float* out) {
  switch (L.quant) {
    case KvQuant::int8: return unpack_row<8>(row, L.head_dim, out);
    case KvQuant::int4: return unpack_row<4>(row, L.head_dim, out);
    case KvQuant::int2: return unpack_row<2>(row, L.head_dim, out);
    case KvQuant::none: break;
  }
  throw std::logic_error("unpack_codes: the pool is not quantized");
}

void dequantize_key_row(const uint8_t* block, int head, int slot, const KvBlockLayout& L, float* out) {
  const uint16_t* scale = scales_at(block, L.k_scale_offset(head));
  const uint16_t* min = scales_at(block, L.k_min_offset(head));
  unpack_codes(block + L.k_codes_offset(head, slot), L, out);
  for (int c = 0; c < L.head_dim; ++c) out[c] = load_scale(min[c]) + out[c] * load_scale(scale[c]);
}

void dequantize_value_row(const uint8_t* block, int head, int slot, const KvBlockLayout& L, float* out) {
  const uint16_t* scale = scales_at(block, L.v_scale_offset(head, slot));
  const uint16_t* min = scales_at(block, L.v_min_offset(head, slot));
  unpack_codes(block + L.v_codes_offset(head, slot), L, out);
  for (int c = 0; c < L.head_dim; ++c) {
    const int g = c / kKvQuantGroup;
    out[c] = load_scale(min[g]) + out[c] * load_scale(scale[g]);
  }
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
    for (int64_t item = begin; item < end; ++item) {
      const size_t i = size_t(item / L.n_kv_heads);
      const int h = int(item % L.n_kv_heads);
      const float* from = pool.block_f32(src[i]);
      uint8_t* to = pool.block_quantized(dst[i]);
      quantize_keys(from + L.k_offset(h, 0), L.head_dim, to, h, L);
      for (int t = 0; t < L.block_size; ++t) quantize_value_row(from + L.v_offset(h, t), to, h, t, L);
    }
  });
}

void kv_dequantize(std::span<const int32_t> src, std::span<const int32_t> dst, const KvPoolView& pool) {
  require_quantized_pool(pool, "kv_dequantize");
  require_pairs(src, dst, pool, /*src_quantized=*/true, "kv_dequantize");
  const KvBlockLayout& L = pool.layout;
  parallel_for(int64_t(src.size()) * L.n_kv_heads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const size_t i = size_t(item / L.n_kv_heads);
      const int h = int(item % L.n_kv_heads);
      const uint8_t* from = pool.block_quantized(src[i]);
      float* to = pool.block_f32(dst[i]);
      for (int t = 0; t < L.block_size; ++t) {
        dequantize_key_row(from, h, t, L, to + L.k_offset(h, t));
        dequantize_value_row(from, h, t, L, to + L.v_offset(h, t));
      }
    }
  });
}

}  // namespace strata::cpu
