// The quantized matrix products in portable C++ (kernels/cpu/quantized_dot.h): each group of 64 weights is
// dequantized into a small fp32 array, then multiplied with every activation row, in loops the compiler
// vectorizes; and the int8 kernel on rounded activations. The baseline x86-64 level, and the only one on other
// architectures.
#include <cstring>

#include "kernels/cpu/integer_activations.h"
#include "kernels/cpu/quantized_dot.h"

namespace strata::cpu {
namespace {

#define STRATA_INLINE [[gnu::always_inline]] inline

STRATA_INLINE uint16_t load_u16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

// The 64 weights of pair group `group` (n of them: 32 for a lone last block).
STRATA_INLINE void pair_group(const uint8_t* group, bool four_bit, float* w) {
  const float d0 = fp16_to_fp32(load_u16(group)), d1 = fp16_to_fp32(load_u16(group + 2));
  const float m0 = fp16_to_fp32(load_u16(group + 4)), m1 = fp16_to_fp32(load_u16(group + 6));
  const uint8_t* p = group + 8;
  if (four_bit) {
    for (int j = 0; j < 32; ++j) w[j] = d0 * float(p[j] & 0xF) + m0;
    for (int j = 0; j < 32; ++j) w[32 + j] = d1 * float(p[j] >> 4) + m1;
  } else {
    for (int j = 0; j < 32; ++j) w[j] = d0 * float(p[j]) + m0;
    for (int j = 0; j < 32; ++j) w[32 + j] = d1 * float(p[32 + j]) + m1;
  }
}

// The 256 weights of a Q4_K block.
STRATA_INLINE void q4_k_block(const uint8_t* block, float* w) {
  const float d = fp16_to_fp32(load_u16(block)), dmin = fp16_to_fp32(load_u16(block + 2));
  for (int c = 0; c < 4; ++c, w += 64) {
    int sc0, mn0, sc1, mn1;
    k_quant_scale_min(block + 4, 2 * c, sc0, mn0);
    k_quant_scale_min(block + 4, 2 * c + 1, sc1, mn1);
    const float d0 = d * float(sc0), m0 = -dmin * float(mn0), d1 = d * float(sc1), m1 = -dmin * float(mn1);
    const uint8_t* p = block + 16 + 32 * c;
    for (int j = 0; j < 32; ++j) w[j] = d0 * float(p[j] & 0xF) + m0;
    for (int j = 0; j < 32; ++j) w[32 + j] = d1 * float(p[j] >> 4) + m1;
  }
}

// The 256 weights of a Q6_K block: value v has the scale of sub-block v / 16; y = d * scale * u - 32 * d * scale.
STRATA_INLINE void q6_k_block(const uint8_t* block, float* w) {
  const auto* scales = reinterpret_cast<const int8_t*>(block + 192);
  const float d = fp16_to_fp32(load_u16(block + 208));
  uint8_t u[256];
  for (int half = 0; half < 2; ++half) {
    const uint8_t* ql = block + 64 * half;
    const uint8_t* qh = block + 128 + 32 * half;
    uint8_t* v = u + 128 * half;
    for (int l = 0; l < 32; ++l) {
      v[l] = uint8_t((ql[l] & 0xF) | ((qh[l] & 3) << 4));
      v[l + 32] = uint8_t((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4));
      v[l + 64] = uint8_t((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
      v[l + 96] = uint8_t((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
    }
  }
  for (int s = 0; s < 16; ++s) {
    const float ds = d * float(scales[s]), ms = -32.0f * ds;
    for (int j = 0; j < 16; ++j) w[16 * s + j] = ds * float(u[16 * s + j]) + ms;
  }
}

// sums[a] += dot(w, row a of x) over n values.
STRATA_INLINE void add_products(const float* w, int n, const float* x, int64_t x_stride, int64_t n_x, float* sums) {
  for (int64_t a = 0; a < n_x; ++a) {
    const float* xa = x + a * x_stride;
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int j = 0; j < n; ++j) s += w[j] * xa[j];
    sums[a] += s;
  }
}

// Rows of the tile's activations per pass, so that their sums stay on the stack.
constexpr int64_t kTileRows = 8;

STRATA_INLINE void weight_row(const PackedWeight& w, int64_t i, const float* x, int64_t n_x, float* sums) {
  const uint8_t* row = w.data + i * w.row_bytes;
  alignas(64) float values[256];
  switch (w.layout) {
    case PackedLayout::u4_pairs:
    case PackedLayout::u8_pairs: {
      const bool four_bit = w.layout == PackedLayout::u4_pairs;
      const int64_t group_bytes = four_bit ? kU4PairBytes : kU8PairBytes;
      for (int64_t g = 0; 64 * g < w.cols; ++g) {
        pair_group(row + g * group_bytes, four_bit, values);
        const int n = w.cols - 64 * g >= 64 ? 64 : 32;
        add_products(values, n, x + 64 * g, w.cols, n_x, sums);
      }
      break;
    }
    case PackedLayout::q4_k:
    case PackedLayout::q5_k:
    case PackedLayout::q6_k:
      for (int64_t b = 0; b < w.cols / 256; ++b) {
        if (w.layout == PackedLayout::q4_k) {
          q4_k_block(row + b * 144, values);
        } else if (w.layout == PackedLayout::q5_k) {
          dequantize_weight_row(WeightFormat::q5_k, row + b * 176, values, 256);
        } else {
          q6_k_block(row + b * 210, values);
        }
        add_products(values, 256, x + 256 * b, w.cols, n_x, sums);
      }
      break;
    case PackedLayout::f16:
    case PackedLayout::bf16: {
      const WeightFormat format = w.layout == PackedLayout::f16 ? WeightFormat::f16 : WeightFormat::bf16;
      for (int64_t j = 0; j < w.cols; j += 256) {
        const int n = w.cols - j >= 256 ? 256 : int(w.cols - j);
        dequantize_weight_row(format, row + 2 * j, values, n);
        add_products(values, n, x + j, w.cols, n_x, sums);
      }
      break;
    }
    case PackedLayout::f32:        // not a quantized layout: matmul never sends it here
    case PackedLayout::u4_rows16:  // multiplied with int8 activations only (quantized_matmul_fused refuses them)
    case PackedLayout::u8_rows16:
    case PackedLayout::k4_rows16:
    case PackedLayout::k5_rows16:
    case PackedLayout::k6_rows16: break;
  }
}

STRATA_INLINE void portable_dot(const PackedWeight& w, int64_t row_begin, int64_t row_end, const float* x,
                                int64_t n_x, float* out, int64_t out_stride) {
  for (int64_t a0 = 0; a0 < n_x; a0 += kTileRows) {
    const int64_t rows = n_x - a0 < kTileRows ? n_x - a0 : kTileRows;
    for (int64_t i = row_begin; i < row_end; ++i) {
      float sums[kTileRows] = {};
      weight_row(w, i, x + a0 * w.cols, rows, sums);
      for (int64_t a = 0; a < rows; ++a) out[(a0 + a) * out_stride + i] = sums[a];
    }
  }
}

// The int8 kernel: the sums of quantized_dot_avx2.cpp's, in plain integer loops.

// Block 0 and block 1 of a pair group's codes against 64 activation values (q = 256 q_high + q_low with two
// digits, `low` not null): (u . q) of each.
template <bool FourBit>
STRATA_INLINE void group_dots(const uint8_t* payload, const int8_t* high, const int8_t* low, int32_t& dot0,
                              int32_t& dot1) {
  dot0 = dot1 = 0;
  for (int j = 0; j < 32; ++j) {
    const int u0 = FourBit ? payload[j] & 0xF : payload[j];
    const int u1 = FourBit ? payload[j] >> 4 : payload[32 + j];
    dot0 += u0 * (low ? 256 * high[j] + low[j] : high[j]);
    dot1 += u1 * (low ? 256 * high[32 + j] + low[32 + j] : high[32 + j]);
  }
}

template <bool FourBit>
float row_dot(const uint8_t* row, const IntegerActivations& x, int64_t a) {
  constexpr int64_t kGroupBytes = FourBit ? kU4PairBytes : kU8PairBytes;
  const int8_t* high = x.row_values(a);
  const int8_t* low = x.digits == 2 ? x.row_low_values(a) : nullptr;
  const float* scales = x.row_scales(a);
  float sum = 0.0f;
  for (int64_t g = 0; g < x.groups; ++g) {
    const uint8_t* group = row + g * kGroupBytes;
    const float* s = scales + 4 * g;  // d0, d1, s0, s1
    int32_t dot0, dot1;
    group_dots<FourBit>(group + 8, high + 64 * g, low ? low + 64 * g : nullptr, dot0, dot1);
    sum += fp16_to_fp32(load_u16(group)) * s[0] * float(dot0) + fp16_to_fp32(load_u16(group + 2)) * s[1] * float(dot1) +
           fp16_to_fp32(load_u16(group + 4)) * s[2] + fp16_to_fp32(load_u16(group + 6)) * s[3];
  }
  return sum;
}

// Row i of a 16-row tile layout against row a of the rounded activations, block by block; with two digits,
// q = 256 q_high + q_low.
float rows16_row_dot(const PackedWeight& w, int64_t i, const IntegerActivations& x, int64_t a) {
  const int8_t* high = x.row_values(a);
  const int8_t* low = x.digits == 2 ? x.row_low_values(a) : nullptr;
  const float* scales = x.row_scales(a);
  const float* half_sums = x.row_half_sums(a);
  float sum = 0.0f;
  for (int64_t b = 0; b < w.cols / 32; ++b) {
    const Rows16Block block = rows16_block_values(w, i / kTileRows16, b, int(i % kTileRows16));
    const float d_x = scales[4 * (b / 2) + b % 2];  // of the block's pair: d0, d1, s0, s1
    for (int h = 0; h < 2; ++h) {
      int32_t dot = 0;
      for (int64_t v = 32 * b + 16 * h; v < 32 * b + 16 * h + 16; ++v) {
        const int32_t q = low ? 256 * high[v] + low[v] : high[v];
        dot += (block.u[v - 32 * b] - block.zero) * q;
      }
      sum += block.d[h] * d_x * float(dot) + block.m[h] * half_sums[2 * b + h];
    }
  }
  return sum;
}

}  // namespace

void quantized_dot_baseline(const PackedWeight& w, int64_t row_begin, int64_t row_end, const float* x, int64_t n_x,
                            float* out, int64_t out_stride) {
  portable_dot(w, row_begin, row_end, x, n_x, out, out_stride);
}

void quantized_dot_int8_baseline(const PackedWeight& w, int64_t row_begin, int64_t row_end,
                                 const IntegerActivations& x, float* out, int64_t out_stride) {
  for (int64_t i = row_begin; i < row_end; ++i) {
    const uint8_t* row = w.data + i * w.row_bytes;
    for (int64_t a = 0; a < x.rows; ++a) {
      if (is_rows16(w.layout)) {
        out[a * out_stride + i] = rows16_row_dot(w, i, x, a);
      } else {
        out[a * out_stride + i] =
            w.layout == PackedLayout::u4_pairs ? row_dot<true>(row, x, a) : row_dot<false>(row, x, a);
      }
    }
  }
}

}  // namespace strata::cpu
