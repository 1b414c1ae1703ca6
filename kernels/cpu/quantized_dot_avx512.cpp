// The quantized matrix products for x86-64 with AVX-512 (kernels/cpu/quantized_dot.h). Everything after the
// includes is compiled for that level by the pragma below, so that no inline function of a header (compiled here
// and perhaps chosen by the linker for every caller) can carry AVX-512 code into baseline callers.
//
// Each group of 64 weights becomes four zmm of fp32 in registers (unsigned integers widened, converted, then
// d * u + m in one fused multiply-add), and every activation row of the tile multiplies them into accumulators of
// its own: the weights are read from memory once per call whatever the number of rows, and the arithmetic is the
// fp32 reference's up to the order of the sums.
#include "kernels/cpu/quantized_dot.h"
#include "kernels/cpu/weight_prefetch.h"

#if STRATA_QUANTIZED_DOT_X86
#include <immintrin.h>

#include <cstring>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,f16c,fma")
// GCC 12 takes the self-initialised _mm512_undefined_* inside its own intrinsics for uninitialised reads.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace strata::cpu {
namespace {

constexpr int kMaxRows = 4;  // activation rows per pass over a weight row (more spill the accumulators)

// Per activation row, independent sums (more than one: a fused multiply-add takes 4 cycles to feed the next).
template <int R>
struct Accumulators {
  static constexpr int kChains = R == 1 ? 4 : 2;
  __m512 sum[R][kChains];

  Accumulators() {
    for (int r = 0; r < R; ++r) {
      for (int c = 0; c < kChains; ++c) sum[r][c] = _mm512_setzero_ps();
    }
  }
  // Adds w[k] * x[16k .. 16k + 15] of every row, for k < n (16 weights each).
  template <int N>
  void add(const __m512 (&w)[N], const float* x, int64_t x_stride) {
    for (int r = 0; r < R; ++r) {
      for (int k = 0; k < N; ++k) {
        sum[r][k % kChains] = _mm512_fmadd_ps(w[k], _mm512_loadu_ps(x + r * x_stride + 16 * k), sum[r][k % kChains]);
      }
    }
  }
  void store(float* out, int64_t out_stride) const {
    for (int r = 0; r < R; ++r) {
      __m512 total = sum[r][0];
      for (int c = 1; c < kChains; ++c) total = _mm512_add_ps(total, sum[r][c]);
      out[r * out_stride] = _mm512_reduce_add_ps(total);
    }
  }
};

inline __m512 broadcast_lane(__m512 v, int lane) { return _mm512_permutexvar_ps(_mm512_set1_epi32(lane), v); }

// 16 bytes widened to 16 unsigned 32-bit integers.
inline __m512i bytes(const uint8_t* p) {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// d * u + m for 16 unsigned 32-bit integers.
inline __m512 scaled(__m512i u, __m512 d, __m512 m) { return _mm512_fmadd_ps(_mm512_cvtepi32_ps(u), d, m); }

// The fp32 vector of this level, its lanes, and a value in every lane (quantized_dot_rows.inc's q5_k_row).
using Vec = __m512;
constexpr int kLanes = 16;
inline Vec splat(float v) { return _mm512_set1_ps(v); }

// kLanes f16 or bf16 values (32 bytes) widened to fp32: F16C's conversion, or bf16's bits moved to fp32's top half.
template <bool Bf16>
inline __m512 halves(const uint8_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  if constexpr (Bf16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  return _mm512_cvtph_ps(h);
}

// One pair group (kernels/cpu/packed_weight.h) as fp32: 4 zmm; the first 2 for a lone last block.
template <bool FourBit>
inline void pair_group(const uint8_t* group, __m512 (&w)[4]) {
  const __m512 h = _mm512_zextps128_ps512(_mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(group))));
  const __m512 d0 = broadcast_lane(h, 0), d1 = broadcast_lane(h, 1), m0 = broadcast_lane(h, 2),
               m1 = broadcast_lane(h, 3);
  const uint8_t* p = group + 8;
  if (FourBit) {  // byte j: value j in the low nibble, value 32 + j in the high one
    const __m512i low4 = _mm512_set1_epi32(0x0F);
    const __m512i b0 = bytes(p), b1 = bytes(p + 16);
    w[0] = scaled(_mm512_and_si512(b0, low4), d0, m0);
    w[1] = scaled(_mm512_and_si512(b1, low4), d0, m0);
    w[2] = scaled(_mm512_srli_epi32(b0, 4), d1, m1);
    w[3] = scaled(_mm512_srli_epi32(b1, 4), d1, m1);
  } else {
    w[0] = scaled(bytes(p), d0, m0);
    w[1] = scaled(bytes(p + 16), d0, m0);
    w[2] = scaled(bytes(p + 32), d1, m1);
    w[3] = scaled(bytes(p + 48), d1, m1);
  }
}

template <int R, bool FourBit>
void pair_row(const uint8_t* row, int64_t cols, const float* x, int64_t x_stride, float* out, int64_t out_stride) {
  constexpr int64_t kGroupBytes = FourBit ? kU4PairBytes : kU8PairBytes;
  Accumulators<R> acc;
  const int64_t full_groups = cols / 64;
  for (int64_t g = 0; g < full_groups; ++g) {
    __m512 w[4];
    pair_group<FourBit>(row + g * kGroupBytes, w);
    acc.add(w, x + 64 * g, x_stride);
  }
  if (cols % 64 != 0) {  // a last group holding one block of 32
    __m512 w[4];
    pair_group<FourBit>(row + full_groups * kGroupBytes, w);
    const __m512 first[2] = {w[0], w[1]};
    acc.add(first, x + 64 * full_groups, x_stride);
  }
  acc.store(out, out_stride);
}

// The integer values of one pair group as 4 zmm of fp32 (u, not yet scaled).
template <bool FourBit>
inline void pair_values(const uint8_t* payload, __m512 (&u)[4]) {
  if (FourBit) {
    const __m512i low4 = _mm512_set1_epi32(0x0F);
    const __m512i b0 = bytes(payload), b1 = bytes(payload + 16);
    u[0] = _mm512_cvtepi32_ps(_mm512_and_si512(b0, low4));
    u[1] = _mm512_cvtepi32_ps(_mm512_and_si512(b1, low4));
    u[2] = _mm512_cvtepi32_ps(_mm512_srli_epi32(b0, 4));
    u[3] = _mm512_cvtepi32_ps(_mm512_srli_epi32(b1, 4));
  } else {
    for (int k = 0; k < 4; ++k) u[k] = _mm512_cvtepi32_ps(bytes(payload + 16 * k));
  }
}

// One weight row against one activation row, the decode of a lone sequence, where the kernel must keep up with
// memory: sum over blocks of d (u . x) + m sum(x), which spends two fused multiply-adds per block on scaling
// instead of one per 16 weights. block_sums[4g + 2 + k] holds the sum of x over block k of group g (lanes 0 and 1
// of each 4 are 0), so that one 128-bit multiply-add per group takes both offsets.
template <bool FourBit>
float pair_row_single(const uint8_t* row, int64_t cols, const float* x, const float* block_sums) {
  constexpr int64_t kGroupBytes = FourBit ? kU4PairBytes : kU8PairBytes;
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  __m128 offsets = _mm_setzero_ps();
  const int64_t groups = (cols + 63) / 64;
  const WeightPrefetch prefetch = decode_prefetch(WeightPrefetch::near);  // into the next rows too
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* group = row + g * kGroupBytes;
    prefetch_ahead<kGroupBytes>(group, prefetch);
    const __m128 h = _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(group)));  // d0 d1 m0 m1
    offsets = _mm_fmadd_ps(h, _mm_loadu_ps(block_sums + 4 * g), offsets);
    __m512 u[4];
    pair_values<FourBit>(group + 8, u);
    const float* xg = x + 64 * g;
    const __m512 t0 = _mm512_fmadd_ps(u[1], _mm512_loadu_ps(xg + 16), _mm512_mul_ps(u[0], _mm512_loadu_ps(xg)));
    acc0 = _mm512_fmadd_ps(t0, broadcast_lane(_mm512_zextps128_ps512(h), 0), acc0);
    if (64 * g + 32 < cols) {  // not a lone last block
      const __m512 t1 = _mm512_fmadd_ps(u[3], _mm512_loadu_ps(xg + 48), _mm512_mul_ps(u[2], _mm512_loadu_ps(xg + 32)));
      acc1 = _mm512_fmadd_ps(t1, broadcast_lane(_mm512_zextps128_ps512(h), 1), acc1);
    }
  }
  float lanes[4];
  _mm_storeu_ps(lanes, offsets);
  return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) + lanes[2] + lanes[3];
}

// The block sums pair_row_single reads, for a row of x of `cols` values (a multiple of 32).
inline void pair_block_sums(const float* x, int64_t cols, float* sums) {
  for (int64_t g = 0; 64 * g < cols; ++g) {
    sums[4 * g] = sums[4 * g + 1] = sums[4 * g + 3] = 0.0f;
    for (int k = 0; k < 2 && 64 * g + 32 * k < cols; ++k) {
      const float* xb = x + 64 * g + 32 * k;
      sums[4 * g + 2 + k] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_loadu_ps(xb), _mm512_loadu_ps(xb + 16)));
    }
  }
}

// Q4_K: per block of 256, d * scale and -dmin * min of its 8 sub-blocks (6-bit fields packed in 12 bytes,
// kernels/weight_format.h), then its 4 chunks of 32 nibble bytes, each a u4 group of 64 (sub-blocks 2c, 2c + 1).
template <int R>
void q4_k_row(const uint8_t* row, int64_t cols, const float* x, int64_t x_stride, float* out, int64_t out_stride) {
  Accumulators<R> acc;
  const __m512i low4 = _mm512_set1_epi32(0x0F);
  for (int64_t b = 0; b < cols / 256; ++b) {
    const uint8_t* block = row + b * 144;
    uint32_t d_dmin, aux[3];
    std::memcpy(&d_dmin, block, 4);
    std::memcpy(aux, block + 4, 12);
    const uint64_t scales = uint64_t(aux[0] & 0x3F3F3F3Fu) |
                            uint64_t((aux[2] & 0x0F0F0F0Fu) | ((aux[0] >> 2) & 0x30303030u)) << 32;
    const uint64_t mins = uint64_t(aux[1] & 0x3F3F3F3Fu) |
                          uint64_t(((aux[2] >> 4) & 0x0F0F0F0Fu) | ((aux[1] >> 2) & 0x30303030u)) << 32;
    const __m512 dd = _mm512_zextps128_ps512(_mm_cvtph_ps(_mm_cvtsi32_si128(int(d_dmin))));  // [d, dmin, 0...]
    // Lanes 0-7: d * scale(s); lanes 8-15: -dmin * min(s).
    const __m512i fields = _mm512_cvtepu8_epi32(_mm_set_epi64x(int64_t(mins), int64_t(scales)));
    const __m512 factor = _mm512_mask_blend_ps(0xFF00, broadcast_lane(dd, 0),
                                               _mm512_sub_ps(_mm512_setzero_ps(), broadcast_lane(dd, 1)));
    const __m512 sub = _mm512_mul_ps(_mm512_cvtepi32_ps(fields), factor);
    for (int c = 0; c < 4; ++c) {
      const uint8_t* p = block + 16 + 32 * c;
      const __m512 d0 = broadcast_lane(sub, 2 * c), d1 = broadcast_lane(sub, 2 * c + 1);
      const __m512 m0 = broadcast_lane(sub, 8 + 2 * c), m1 = broadcast_lane(sub, 8 + 2 * c + 1);
      const __m512i b0 = bytes(p), b1 = bytes(p + 16);
      const __m512 w[4] = {scaled(_mm512_and_si512(b0, low4), d0, m0), scaled(_mm512_and_si512(b1, low4), d0, m0),
                           scaled(_mm512_srli_epi32(b0, 4), d1, m1), scaled(_mm512_srli_epi32(b1, 4), d1, m1)};
      acc.add(w, x + 256 * b + 64 * c, x_stride);
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
  const __m512i low4 = _mm512_set1_epi8(0x0F), high2 = _mm512_set1_epi8(0x30);
  const __m512i shift_low = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
  const __m512i shift_high = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
  for (int64_t b = 0; b < cols / 256; ++b) {
    const uint8_t* block = row + b * 210;
    uint16_t d_bits;
    std::memcpy(&d_bits, block + 208, 2);
    const __m512 sub_d = _mm512_mul_ps(
        _mm512_set1_ps(_cvtsh_ss(d_bits)),
        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 192)))));
    const __m512 sub_m = _mm512_mul_ps(sub_d, _mm512_set1_ps(-32.0f));
    for (int half = 0; half < 2; ++half) {
      const __m512i ql = _mm512_loadu_si512(block + 64 * half);
      const __m512i qh =
          _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 128 + 32 * half)));
      const __m512i runs[2] = {
          _mm512_or_si512(_mm512_and_si512(ql, low4), _mm512_and_si512(_mm512_sllv_epi16(qh, shift_low), high2)),
          _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low4),
                          _mm512_and_si512(_mm512_srlv_epi16(qh, shift_high), high2))};
      for (int k = 0; k < 2; ++k) {
        const int sub = 8 * half + 4 * k;  // first sub-block of 16 in these 64 values
        const __m512 w[4] = {
            scaled(_mm512_cvtepu8_epi32(_mm512_castsi512_si128(runs[k])), broadcast_lane(sub_d, sub),
                   broadcast_lane(sub_m, sub)),
            scaled(_mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(runs[k], 1)), broadcast_lane(sub_d, sub + 1),
                   broadcast_lane(sub_m, sub + 1)),
            scaled(_mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(runs[k], 2)), broadcast_lane(sub_d, sub + 2),
                   broadcast_lane(sub_m, sub + 2)),
            scaled(_mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(runs[k], 3)), broadcast_lane(sub_d, sub + 3),
                   broadcast_lane(sub_m, sub + 3))};
        acc.add(w, x + 256 * b + 128 * half + 64 * k, x_stride);
      }
    }
  }
  acc.store(out, out_stride);
}

#include "kernels/cpu/quantized_dot_rows.inc"

}  // namespace

void quantized_dot_avx512(const PackedWeight& w, int64_t row_begin, int64_t row_end, const float* x, int64_t n_x,
                          float* out, int64_t out_stride) {
  quantized_dot_of_level(w, row_begin, row_end, x, n_x, out, out_stride);
}

}  // namespace strata::cpu

#pragma GCC diagnostic pop
#pragma GCC pop_options

#endif
