// The quantized matrix products for x86-64-v3: AVX2, FMA, F16C (kernels/cpu/quantized_dot.h), on fp32 activations
// and on int8 ones. The AVX-512 file's
// scheme at half the width, for the machines without AVX-512 (AMD before Zen 4, Intel client cores): everything
// after the includes is compiled for that level by the pragma below, so that no inline function of a header can
// carry AVX2 code into baseline callers.
//
// Each block of 32 weights becomes four ymm of fp32 in registers (unsigned integers widened, converted, then
// d * u + m in one fused multiply-add), and every activation row of the tile multiplies them into accumulators of
// its own. A lone activation row (the decode of one sequence) takes the scaled-sum form instead, as on AVX-512.
// The arithmetic is the fp32 reference's up to the order of the sums.
#include "kernels/cpu/integer_activations.h"
#include "kernels/cpu/quantized_dot.h"
#include "kernels/cpu/weight_prefetch.h"

#if STRATA_QUANTIZED_DOT_X86
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

namespace strata::cpu {
namespace {

// Activation rows per pass over a weight row: the weights are taken 32 at a time (4 ymm), so that 8 rows' sums fit
// in the 16 registers beside them.
constexpr int kMaxRows = 8;

inline float horizontal_sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Per activation row, independent sums (a fused multiply-add takes 4 to 5 cycles to feed the next).
template <int R>
struct Accumulators {
  static constexpr int kChains = R == 1 ? 4 : R == 2 ? 2 : 1;
  __m256 sum[R][kChains];

  Accumulators() {
    for (int r = 0; r < R; ++r) {
      for (int c = 0; c < kChains; ++c) sum[r][c] = _mm256_setzero_ps();
    }
  }
  // Adds w[k] * x[8k .. 8k + 7] of every row, for k < N (8 weights each).
  template <int N>
  void add(const __m256 (&w)[N], const float* x, int64_t x_stride) {
    for (int r = 0; r < R; ++r) {
      for (int k = 0; k < N; ++k) {
        sum[r][k % kChains] = _mm256_fmadd_ps(w[k], _mm256_loadu_ps(x + r * x_stride + 8 * k), sum[r][k % kChains]);
      }
    }
  }
  void store(float* out, int64_t out_stride) const {
    for (int r = 0; r < R; ++r) {
      __m256 total = sum[r][0];
      for (int c = 1; c < kChains; ++c) total = _mm256_add_ps(total, sum[r][c]);
      out[r * out_stride] = horizontal_sum(total);
    }
  }
};

// 8 bytes widened to 8 unsigned 32-bit integers.
inline __m256i bytes(const uint8_t* p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}

// d * u + m for 8 unsigned 32-bit integers.
inline __m256 scaled(__m256i u, __m256 d, __m256 m) { return _mm256_fmadd_ps(_mm256_cvtepi32_ps(u), d, m); }

// The fp32 vector of this level, its lanes, and a value in every lane (quantized_dot_rows.inc's q5_k_row).
using Vec = __m256;
constexpr int kLanes = 8;
inline Vec splat(float v) { return _mm256_set1_ps(v); }

// kLanes f16 or bf16 values (16 bytes) widened to fp32: F16C's conversion, or bf16's bits moved to fp32's top half.
template <bool Bf16>
inline __m256 halves(const uint8_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  if constexpr (Bf16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  return _mm256_cvtph_ps(h);
}

// The integer values of one pair group (kernels/cpu/packed_weight.h) as 8 ymm of fp32 (u, not yet scaled): values
// 8k .. 8k + 7 in u[k].
template <bool FourBit>
inline void pair_values(const uint8_t* payload, __m256 (&u)[8]) {
  if (FourBit) {  // byte j: value j in the low nibble, value 32 + j in the high one
    const __m256i low4 = _mm256_set1_epi32(0x0F);
    for (int k = 0; k < 4; ++k) {
      const __m256i b = bytes(payload + 8 * k);
      u[k] = _mm256_cvtepi32_ps(_mm256_and_si256(b, low4));
      u[4 + k] = _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4));
    }
  } else {
    for (int k = 0; k < 8; ++k) u[k] = _mm256_cvtepi32_ps(bytes(payload + 8 * k));
  }
}

// Block `block` (0 or 1) of a pair group's payload as 4 ymm of fp32 weights d * u + m.
template <bool FourBit>
inline void block_weights(const uint8_t* payload, int block, __m256 d, __m256 m, __m256 (&w)[4]) {
  const __m256i low4 = _mm256_set1_epi32(0x0F);
  for (int k = 0; k < 4; ++k) {
    __m256i u;
    if (FourBit) {
      const __m256i b = bytes(payload + 8 * k);
      u = block == 0 ? _mm256_and_si256(b, low4) : _mm256_srli_epi32(b, 4);
    } else {
      u = bytes(payload + 32 * block + 8 * k);
    }
    w[k] = scaled(u, d, m);
  }
}

inline __m256 broadcast_lane(__m128 v, int lane) {
  return _mm256_permutevar8x32_ps(_mm256_castps128_ps256(v), _mm256_set1_epi32(lane));
}

template <int R, bool FourBit>
void pair_row(const uint8_t* row, int64_t cols, const float* x, int64_t x_stride, float* out, int64_t out_stride) {
  constexpr int64_t kGroupBytes = FourBit ? kU4PairBytes : kU8PairBytes;
  Accumulators<R> acc;
  for (int64_t g = 0; 64 * g < cols; ++g) {
    const uint8_t* group = row + g * kGroupBytes;
    const __m128 h = _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(group)));  // d0 d1 m0 m1
    for (int block = 0; block < 2 && 64 * g + 32 * block < cols; ++block) {  // a last group may hold one block
      __m256 w[4];
      block_weights<FourBit>(group + 8, block, broadcast_lane(h, block), broadcast_lane(h, 2 + block), w);
      acc.add(w, x + 64 * g + 32 * block, x_stride);
    }
  }
  acc.store(out, out_stride);
}

// One weight row against one activation row: sum over blocks of d (u . x) + m sum(x), as on AVX-512.
// block_sums[4g + 2 + k] holds the sum of x over block k of group g (lanes 0 and 1 of each 4 are 0).
template <bool FourBit>
float pair_row_single(const uint8_t* row, int64_t cols, const float* x, const float* block_sums) {
  constexpr int64_t kGroupBytes = FourBit ? kU4PairBytes : kU8PairBytes;
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  __m128 offsets = _mm_setzero_ps();
  const int64_t groups = (cols + 63) / 64;
  const WeightPrefetch prefetch = decode_prefetch(WeightPrefetch::near);  // into the next rows too
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* group = row + g * kGroupBytes;
    prefetch_ahead<kGroupBytes>(group, prefetch);
    const __m128 h = _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(group)));  // d0 d1 m0 m1
    offsets = _mm_fmadd_ps(h, _mm_loadu_ps(block_sums + 4 * g), offsets);
    __m256 u[8];
    pair_values<FourBit>(group + 8, u);
    const float* xg = x + 64 * g;
    __m256 t0 = _mm256_mul_ps(u[0], _mm256_loadu_ps(xg));
    __m256 t0b = _mm256_mul_ps(u[1], _mm256_loadu_ps(xg + 8));
    t0 = _mm256_fmadd_ps(u[2], _mm256_loadu_ps(xg + 16), t0);
    t0b = _mm256_fmadd_ps(u[3], _mm256_loadu_ps(xg + 24), t0b);
    acc0 = _mm256_fmadd_ps(_mm256_add_ps(t0, t0b), _mm256_set1_ps(_mm_cvtss_f32(h)), acc0);
    if (64 * g + 32 < cols) {  // not a lone last block
      __m256 t1 = _mm256_mul_ps(u[4], _mm256_loadu_ps(xg + 32));
      __m256 t1b = _mm256_mul_ps(u[5], _mm256_loadu_ps(xg + 40));
      t1 = _mm256_fmadd_ps(u[6], _mm256_loadu_ps(xg + 48), t1);
      t1b = _mm256_fmadd_ps(u[7], _mm256_loadu_ps(xg + 56), t1b);
      acc1 = _mm256_fmadd_ps(_mm256_add_ps(t1, t1b), _mm256_set1_ps(_mm_cvtss_f32(_mm_movehdup_ps(h))), acc1);
    }
  }
  float lanes[4];
  _mm_storeu_ps(lanes, offsets);
  return horizontal_sum(_mm256_add_ps(acc0, acc1)) + lanes[2] + lanes[3];
}

// The block sums pair_row_single reads, for a row of x of `cols` values (a multiple of 32).
inline void pair_block_sums(const float* x, int64_t cols, float* sums) {
  for (int64_t g = 0; 64 * g < cols; ++g) {
    sums[4 * g] = sums[4 * g + 1] = sums[4 * g + 3] = 0.0f;
    for (int k = 0; k < 2 && 64 * g + 32 * k < cols; ++k) {
      const float* xb = x + 64 * g + 32 * k;
      const __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(xb), _mm256_loadu_ps(xb + 8)),
                                     _mm256_add_ps(_mm256_loadu_ps(xb + 16), _mm256_loadu_ps(xb + 24)));
      sums[4 * g + 2 + k] = horizontal_sum(s);
    }
  }
}

// Q4_K: per block of 256, d * scale and -dmin * min of its 8 sub-blocks (kernels/weight_format.h), then its 4
// chunks of 32 nibble bytes, each a u4 group of 64 (sub-blocks 2c, 2c + 1).
template <int R>
void q4_k_row(const uint8_t* row, int64_t cols, const float* x, int64_t x_stride, float* out, int64_t out_stride) {
  Accumulators<R> acc;
  for (int64_t b = 0; b < cols / 256; ++b) {
    const uint8_t* block = row + b * 144;
    uint16_t d_bits, dmin_bits;
    std::memcpy(&d_bits, block, 2);
    std::memcpy(&dmin_bits, block + 2, 2);
    const float d = _cvtsh_ss(d_bits), dmin = _cvtsh_ss(dmin_bits);
    for (int c = 0; c < 4; ++c) {
      int sc0, mn0, sc1, mn1;
      k_quant_scale_min(block + 4, 2 * c, sc0, mn0);
      k_quant_scale_min(block + 4, 2 * c + 1, sc1, mn1);
      __m256 w[4];
      block_weights<true>(block + 16 + 32 * c, 0, _mm256_set1_ps(d * float(sc0)), _mm256_set1_ps(-dmin * float(mn0)),
                          w);
      acc.add(w, x + 256 * b + 64 * c, x_stride);
      block_weights<true>(block + 16 + 32 * c, 1, _mm256_set1_ps(d * float(sc1)), _mm256_set1_ps(-dmin * float(mn1)),
                          w);
      acc.add(w, x + 256 * b + 64 * c + 32, x_stride);
    }
  }
  acc.store(out, out_stride);
}

// Q6_K: per half block of 128 values, ql's 64 bytes give the low 4 bits of values 0-63 (low nibbles) and 64-127
// (high nibbles); qh's 32 bytes give the 2 high bits, at bit pairs 0, 2, 4, 6 for the four runs of 32. Value v of
// the block has the scale of sub-block v / 16: y = d * scale * u - 32 * d * scale.
template <int R>
void q6_k_row(const uint8_t* row, int64_t cols, const float* x, int64_t x_stride, float* out, int64_t out_stride) {
  Accumulators<R> acc;
  const __m256i low4 = _mm256_set1_epi8(0x0F), high2 = _mm256_set1_epi8(0x30);
  for (int64_t b = 0; b < cols / 256; ++b) {
    const uint8_t* block = row + b * 210;
    const auto* scales = reinterpret_cast<const int8_t*>(block + 192);
    uint16_t d_bits;
    std::memcpy(&d_bits, block + 208, 2);
    const float d = _cvtsh_ss(d_bits);
    for (int half = 0; half < 2; ++half) {
      const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 64 * half));
      const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 64 * half + 32));
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 128 + 32 * half));
      alignas(32) uint8_t u[128];  // values 128 * half + v, v < 128, as bytes
      // Runs of 32: low nibbles of ql0, ql1, then high nibbles; the 16-bit shifts' spill across bytes is masked off.
      const __m256i runs[4] = {_mm256_and_si256(ql0, low4), _mm256_and_si256(ql1, low4),
                               _mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4),
                               _mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4)};
      const __m256i highs[4] = {_mm256_slli_epi16(qh, 4), _mm256_slli_epi16(qh, 2), qh, _mm256_srli_epi16(qh, 2)};
      for (int r = 0; r < 4; ++r) {
        _mm256_store_si256(reinterpret_cast<__m256i*>(u + 32 * r),
                           _mm256_or_si256(runs[r], _mm256_and_si256(highs[r], high2)));
      }
      for (int run = 0; run < 4; ++run) {  // 32 values: two sub-blocks of 16, two ymm each
        __m256 w[4];
        for (int k = 0; k < 4; ++k) {
          const float ds = d * float(scales[8 * half + 2 * run + k / 2]);
          w[k] = scaled(bytes(u + 32 * run + 8 * k), _mm256_set1_ps(ds), _mm256_set1_ps(-32.0f * ds));
        }
        acc.add(w, x + 256 * b + 128 * half + 32 * run, x_stride);
      }
    }
  }
  acc.store(out, out_stride);
}

// The int8 kernel (engine.activation_dtype: int8, kernels/cpu/integer_activations.h). Per pair group of a weight row,
// the 64 unsigned codes are loaded once as two ymm of bytes, and every activation row of the tile multiplies them
// with its int8 values: vpmaddubsw (unsigned x signed bytes, adjacent pairs summed into 16 bits) then vpmaddwd by
// ones (into 32 bits), 32 products in two instructions where the fp32 kernel needs four multiply-adds and four
// conversions. A u8 code (Q8_0's u = q + 128) times 127 could overflow vpmaddubsw's 16-bit pair sums, so those codes
// are taken back to signed q = u - 128 and multiplied by sign: |q| times x with q's sign, at most 2 * 128 * 127 in
// a pair; the 128 * sum(x) that this leaves out joins the offset, as (m + 128 d) s. The block scales and offsets of
// a group for one row are one 128-bit product: [d_w0, d_w1, m_w0, m_w1] * [d0, d1, s0, s1].
//
// With two digits (int16) the codes are widened to 16 bits once per group and multiplied with the activations as
// int16 (IntegerActivations::q16) by vpmaddwd: 16 products an instruction, as many a row as vpmaddubsw's 32 and the
// widening vpmaddwd of one digit, where vpmaddubsw would need a sign trick that q_low's -128 breaks.

constexpr int kInt8MaxRows = 4;   // activation rows per pass over a weight row
constexpr int kInt16MaxRows = 2;  // with two digits: the widened codes take four more registers

template <bool FourBit>
inline void group_codes(const uint8_t* payload, __m256i& low, __m256i& high) {
  if (FourBit) {
    const __m256i nibble = _mm256_set1_epi8(0x0F);
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(payload));
    low = _mm256_and_si256(b, nibble);
    high = _mm256_and_si256(_mm256_srli_epi16(b, 4), nibble);
  } else {
    const __m256i bias = _mm256_set1_epi8(static_cast<char>(0x80));
    low = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(payload)), bias);
    high = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(payload + 32)), bias);
  }
}

// The 32 products of one block's codes and activation values, summed into 8 lanes, as fp32.
template <bool FourBit>
inline __m256 block_dot(__m256i codes, const int8_t* q) {
  const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
  const __m256i pairs = FourBit ? _mm256_maddubs_epi16(codes, x)
                                : _mm256_maddubs_epi16(_mm256_abs_epi8(codes), _mm256_sign_epi8(x, codes));
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

// A block's 32 codes as group_codes gives them (u4 unsigned, u8 taken as signed) widened to 16 bits: values 0-15 in
// w16[0], 16-31 in w16[1].
template <bool FourBit>
inline void widen_codes(__m256i codes, __m256i (&w16)[2]) {
  const __m128i first = _mm256_castsi256_si128(codes), second = _mm256_extracti128_si256(codes, 1);
  w16[0] = FourBit ? _mm256_cvtepu8_epi16(first) : _mm256_cvtepi8_epi16(first);
  w16[1] = FourBit ? _mm256_cvtepu8_epi16(second) : _mm256_cvtepi8_epi16(second);
}

// The 32 products of a block's widened codes and its int16 activations, summed into 8 lanes, as fp32: exact in 32
// bits (at most 4 x 128 x 32,512 a lane).
inline __m256 block_dot16(const __m256i (&w16)[2], const int16_t* q) {
  const __m256i first = _mm256_madd_epi16(w16[0], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)));
  const __m256i second = _mm256_madd_epi16(w16[1], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 16)));
  return _mm256_cvtepi32_ps(_mm256_add_epi32(first, second));
}

// [d_w0, d_w1, m_w0, m_w1] of a group; for u8 codes taken as signed, m_w + 128 d_w (the part vpmaddubsw left out).
template <bool FourBit>
inline __m128 group_factors(const uint8_t* group) {
  const __m128 h = _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(group)));
  return FourBit ? h : _mm_fmadd_ps(_mm_set1_ps(128.0f), _mm_movelh_ps(_mm_setzero_ps(), h), h);
}

template <int R, bool FourBit, int Digits>
void int8_rows(const PackedWeight& w, int64_t row_begin, int64_t row_end, const IntegerActivations& x, int64_t a0,
                  float* out, int64_t out_stride) {
  constexpr int64_t kGroupBytes = FourBit ? kU4PairBytes : kU8PairBytes;
  for (int64_t i = row_begin; i < row_end; ++i) {
    const uint8_t* row = w.data + i * w.row_bytes;
    __m256 acc[R][2];  // per row, the two blocks' sums apart: two chains of multiply-adds, not one
    __m128 offsets[R];
    for (int r = 0; r < R; ++r) {
      acc[r][0] = acc[r][1] = _mm256_setzero_ps();
      offsets[r] = _mm_setzero_ps();
    }
    for (int64_t g = 0; g < x.groups; ++g) {
      const uint8_t* group = row + g * kGroupBytes;
      prefetch_ahead<kGroupBytes>(group, WeightPrefetch::near);
      const __m128 factors = group_factors<FourBit>(group);
      __m256i low, high, w16[2][2];
      group_codes<FourBit>(group + 8, low, high);
      if constexpr (Digits == 2) {
        widen_codes<FourBit>(low, w16[0]);
        widen_codes<FourBit>(high, w16[1]);
      }
      for (int r = 0; r < R; ++r) {
        // [d_w0 d0, d_w1 d1, m_w0 s0, m_w1 s1]; a lone last block has d1 = s1 = 0 and zero values.
        const __m128 scaled = _mm_mul_ps(factors, _mm_loadu_ps(x.row_scales(a0 + r) + 4 * g));
        offsets[r] = _mm_add_ps(offsets[r], scaled);
        __m256 dots[2];
        if constexpr (Digits == 2) {
          const int16_t* q = x.row_values16(a0 + r) + 64 * g;
          dots[0] = block_dot16(w16[0], q);
          dots[1] = block_dot16(w16[1], q + 32);
        } else {
          const int8_t* q = x.row_values(a0 + r) + 64 * g;
          dots[0] = block_dot<FourBit>(low, q);
          dots[1] = block_dot<FourBit>(high, q + 32);
        }
        acc[r][0] = _mm256_fmadd_ps(dots[0], _mm256_broadcastss_ps(scaled), acc[r][0]);
        acc[r][1] = _mm256_fmadd_ps(dots[1], _mm256_broadcastss_ps(_mm_movehdup_ps(scaled)), acc[r][1]);
      }
    }
    for (int r = 0; r < R; ++r) {
      float lanes[4];
      _mm_storeu_ps(lanes, offsets[r]);
      out[r * out_stride + i] = horizontal_sum(_mm256_add_ps(acc[r][0], acc[r][1])) + lanes[2] + lanes[3];
    }
  }
}

template <int R, int Digits>
void int8_tile(int64_t rows, const PackedWeight& w, int64_t row_begin, int64_t row_end, const IntegerActivations& x,
          int64_t a0, float* out, int64_t out_stride) {
  if constexpr (R > 1) {
    if (rows < R) return int8_tile<R - 1, Digits>(rows, w, row_begin, row_end, x, a0, out, out_stride);
  }
  if (w.layout == PackedLayout::u4_pairs) {
    int8_rows<R, true, Digits>(w, row_begin, row_end, x, a0, out, out_stride);
  } else {
    int8_rows<R, false, Digits>(w, row_begin, row_end, x, a0, out, out_stride);
  }
}

#include "kernels/cpu/quantized_dot_rows.inc"

}  // namespace

void quantized_dot_avx2(const PackedWeight& w, int64_t row_begin, int64_t row_end, const float* x, int64_t n_x,
                        float* out, int64_t out_stride) {
  quantized_dot_of_level(w, row_begin, row_end, x, n_x, out, out_stride);
}

void quantized_dot_int8_avx2(const PackedWeight& w, int64_t row_begin, int64_t row_end, const IntegerActivations& x,
                             float* out, int64_t out_stride) {
  if (w.layout == PackedLayout::u8_rows16) return quantized_dot_int8_baseline(w, row_begin, row_end, x, out, out_stride);
  if (is_rows16(w.layout)) return quantized_dot_rows16_avx2(w, row_begin, row_end, x, out, out_stride);
  const int64_t max_rows = x.digits == 2 ? kInt16MaxRows : kInt8MaxRows;
  for (int64_t a = 0; a < x.rows; a += max_rows) {
    const int64_t rows = std::min(x.rows - a, max_rows);
    if (x.digits == 2) {
      int8_tile<kInt16MaxRows, 2>(rows, w, row_begin, row_end, x, a, out + a * out_stride, out_stride);
    } else {
      int8_tile<kInt8MaxRows, 1>(rows, w, row_begin, row_end, x, a, out + a * out_stride, out_stride);
    }
  }
}

}  // namespace strata::cpu

#pragma GCC pop_options

#endif
