// The int8 kernels (kernels/cpu/quantized_dot.h) for x86-64-v3: AVX2, FMA, F16C. Compiled for that level by the
// pragma below, after the includes (as quantized_dot_avx2.cpp is).
//
// Per pair group of a weight row, the 64 unsigned codes are loaded once as two ymm of bytes, and every activation
// row of the tile multiplies them with its int8 values: vpmaddubsw (unsigned x signed bytes, adjacent pairs summed
// into 16 bits) then vpmaddwd by ones (into 32 bits), 32 products in two instructions where the fp32 kernel needs
// four multiply-adds and four conversions. A u8 code (Q8_0's u = q + 128) times 127 could overflow vpmaddubsw's
// 16-bit pair sums, so those codes are taken back to signed q = u - 128 and multiplied by sign: |q| times x with
// q's sign, at most 2 * 128 * 127 in a pair; the 128 * sum(x) that this leaves out joins the offset, as
// (m + 128 d) s. The block scales and offsets of a group for one row are one 128-bit product:
// [d_w0, d_w1, m_w0, m_w1] * [d0, d1, s0, s1].
#include "kernels/cpu/int8_activations.h"
#include "kernels/cpu/quantized_dot.h"

#if STRATA_QUANTIZED_DOT_X86
#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

namespace strata::cpu {
namespace {

constexpr int kMaxRows = 4;  // activation rows per pass over a weight row
constexpr int64_t kPrefetchBytes = 1024;  // as the fp32 kernels (quantized_dot_avx512.cpp)

inline float horizontal_sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// A pair group's codes: block 0 in `low`, block 1 in `high`, 32 bytes each; u8 codes as signed q = u - 128.
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

// [d_w0, d_w1, m_w0, m_w1] of a group; for u8 codes taken as signed, m_w + 128 d_w (the part vpmaddubsw left out).
template <bool FourBit>
inline __m128 group_factors(const uint8_t* group) {
  const __m128 h = _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(group)));
  return FourBit ? h : _mm_fmadd_ps(_mm_set1_ps(128.0f), _mm_movelh_ps(_mm_setzero_ps(), h), h);
}

template <int R, bool FourBit>
void rows_of_tile(const PackedWeight& w, int64_t row_begin, int64_t row_end, const Int8Activations& x, int64_t a0,
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
      _mm_prefetch(reinterpret_cast<const char*>(group + kPrefetchBytes), _MM_HINT_T0);
      const __m128 factors = group_factors<FourBit>(group);
      __m256i low, high;
      group_codes<FourBit>(group + 8, low, high);
      for (int r = 0; r < R; ++r) {
        // [d_w0 d0, d_w1 d1, m_w0 s0, m_w1 s1]; a lone last block has d1 = s1 = 0 and zero values.
        const __m128 scaled = _mm_mul_ps(factors, _mm_loadu_ps(x.row_scales(a0 + r) + 4 * g));
        offsets[r] = _mm_add_ps(offsets[r], scaled);
        const int8_t* q = x.row_values(a0 + r) + 64 * g;
        acc[r][0] = _mm256_fmadd_ps(block_dot<FourBit>(low, q), _mm256_broadcastss_ps(scaled), acc[r][0]);
        acc[r][1] = _mm256_fmadd_ps(block_dot<FourBit>(high, q + 32), _mm256_broadcastss_ps(_mm_movehdup_ps(scaled)),
                                    acc[r][1]);
      }
    }
    for (int r = 0; r < R; ++r) {
      float lanes[4];
      _mm_storeu_ps(lanes, offsets[r]);
      out[r * out_stride + i] = horizontal_sum(_mm256_add_ps(acc[r][0], acc[r][1])) + lanes[2] + lanes[3];
    }
  }
}

template <int R>
void tile(int64_t rows, const PackedWeight& w, int64_t row_begin, int64_t row_end, const Int8Activations& x,
          int64_t a0, float* out, int64_t out_stride) {
  if constexpr (R > 1) {
    if (rows < R) return tile<R - 1>(rows, w, row_begin, row_end, x, a0, out, out_stride);
  }
  if (w.layout == PackedLayout::u4_pairs) {
    rows_of_tile<R, true>(w, row_begin, row_end, x, a0, out, out_stride);
  } else {
    rows_of_tile<R, false>(w, row_begin, row_end, x, a0, out, out_stride);
  }
}

}  // namespace

void quantized_dot_int8_avx2(const PackedWeight& w, int64_t row_begin, int64_t row_end, const Int8Activations& x,
                             float* out, int64_t out_stride) {
  for (int64_t a = 0; a < x.rows; a += kMaxRows) {
    const int64_t rows = x.rows - a < kMaxRows ? x.rows - a : kMaxRows;
    tile<kMaxRows>(rows, w, row_begin, row_end, x, a, out + a * out_stride, out_stride);
  }
}

}  // namespace strata::cpu

#pragma GCC pop_options

#endif
