// The integer kernel (engine.activation_dtype: int8 and int16, kernels/cpu/integer_activations.h) for x86-64 with
// AVX-512 VNNI (Intel from Cascade Lake, AMD from Zen 4), on both layouts of the 32-value formats and on the
// 16-row tiles of those and the k-quants, with one digit or two (kernels/cpu/packed_weight.h).
// Everything after the includes is compiled for that level by the pragma below, as in the other levels' files.
//
// 16-row tiles, which the CPU backend packs for this level: see rows16_tiles below.
//
// Pair groups (a matrix whose rows are not a multiple of 16): a group's 64 codes are one zmm of bytes, in the order
// of the activation row's 64 values: for u4 the 32 payload bytes, then the same bytes shifted by 4, masked to their
// low nibble; for u8 the 64 bytes as they are. One vpdpbusd multiplies them with an activation row's 64 int8 values
// (unsigned x signed, 4 adjacent products summed into each 32-bit lane): lanes 0-7 hold block 0's sums, lanes 8-15
// block 1's. Unlike vpmaddubsw (the AVX2 kernel), it sums in 32 bits without saturating, so Q8_0's codes
// u = q + 128 are multiplied as they are. Per row the sums are converted and scaled by [d_w0 d0 x 8, d_w1 d1 x 8]
// in one multiply-add, and the offsets m_w0 s0 + m_w1 s1 added as on AVX2.
//
// Either way the result is the dot product with the rounded values d * q, up to the order of the sums (the result
// the other levels give).
#include "kernels/cpu/integer_activations.h"
#include "kernels/cpu/quantized_dot.h"
#include "kernels/cpu/weight_prefetch.h"

#if STRATA_QUANTIZED_DOT_X86
#include <immintrin.h>

#include <cstring>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,f16c,fma")
// GCC 12 takes the self-initialised _mm512_undefined_* inside its own intrinsics for uninitialised reads.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace strata::cpu {
namespace {

// Activation rows per pass over a weight row: 8 rows' sums and offsets take 16 of the 32 registers.
constexpr int kMaxRows = 8;
// With two digits (int16) 4 rows a pass: each row's block takes twice the vpdpbusd chains, and 4 rows a pass made
// batch-8 decode 1.06-1.08x and SmolLM2's prefill 1.22x as fast as 8 (bench/results/cpu-int16-four-rows-*.json).
constexpr int kMaxRowsTwoDigits = 4;

#include "kernels/cpu/rows16_blocks_avx512.inc"

template <bool FourBit>
inline __m512i group_codes(const uint8_t* payload) {
  if (FourBit) {  // byte j: value j in the low nibble, value 32 + j in the high one
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(payload));
    return _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(b), _mm256_srli_epi16(b, 4), 1),
                            _mm512_set1_epi8(0x0F));
  }
  return _mm512_loadu_si512(payload);
}

// One group's codes against every row of the tile: acc[r] += (codes . q_r per lane) * [d_w0 d0 x 8, d_w1 d1 x 8],
// offsets[r] += [., ., m_w0 s0, m_w1 s1]; with two digits codes . q = 256 (codes . q_high) + (codes . q_low).
template <int R, bool FourBit, int Digits>
inline void group_into(const uint8_t* group, const IntegerActivations& x, int64_t a0, int64_t g, __m512 (&acc)[R],
                       __m128 (&offsets)[R]) {
  // Lanes 0-7 take lane 0 of a group's 4 factors (block 0's), lanes 8-15 lane 1.
  const __m512i block_of_lane = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  prefetch_ahead<FourBit ? kU4PairBytes : kU8PairBytes>(group, WeightPrefetch::near);
  const __m128 factors = _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(group)));  // d0 d1 m0 m1
  const __m512i codes = group_codes<FourBit>(group + 8);
  for (int r = 0; r < R; ++r) {
    // [d_w0 d0, d_w1 d1, m_w0 s0, m_w1 s1]; a lone last block has d1 = s1 = 0 and zero values.
    const __m128 scaled = _mm_mul_ps(factors, _mm_loadu_ps(x.row_scales(a0 + r) + 4 * g));
    offsets[r] = _mm_add_ps(offsets[r], scaled);
    const __m512i q = _mm512_loadu_si512(x.row_values(a0 + r) + 64 * g);
    __m512i dots = _mm512_dpbusd_epi32(_mm512_setzero_si512(), codes, q);
    if constexpr (Digits == 2) {
      const __m512i low = _mm512_loadu_si512(x.row_low_values(a0 + r) + 64 * g);
      dots = _mm512_add_epi32(_mm512_slli_epi32(dots, 8), _mm512_dpbusd_epi32(_mm512_setzero_si512(), codes, low));
    }
    acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots),
                             _mm512_permutexvar_ps(block_of_lane, _mm512_castps128_ps512(scaled)), acc[r]);
  }
}

template <int R, bool FourBit, int Digits>
void vnni_rows(const PackedWeight& w, int64_t row_begin, int64_t row_end, const IntegerActivations& x, int64_t a0,
               float* out, int64_t out_stride) {
  constexpr int64_t kGroupBytes = FourBit ? kU4PairBytes : kU8PairBytes;
  for (int64_t i = row_begin; i < row_end; ++i) {
    const uint8_t* row = w.data + i * w.row_bytes;
    // Two sets of sums, for even and odd groups: a lone row's multiply-adds need not wait for the last one.
    __m512 acc[2][R];
    __m128 offsets[2][R];
    for (int c = 0; c < 2; ++c) {
      for (int r = 0; r < R; ++r) {
        acc[c][r] = _mm512_setzero_ps();
        offsets[c][r] = _mm_setzero_ps();
      }
    }
    int64_t g = 0;
    for (; g + 1 < x.groups; g += 2) {
      group_into<R, FourBit, Digits>(row + g * kGroupBytes, x, a0, g, acc[0], offsets[0]);
      group_into<R, FourBit, Digits>(row + (g + 1) * kGroupBytes, x, a0, g + 1, acc[1], offsets[1]);
    }
    if (g < x.groups) group_into<R, FourBit, Digits>(row + g * kGroupBytes, x, a0, g, acc[0], offsets[0]);
    for (int r = 0; r < R; ++r) {
      float lanes[4];
      _mm_storeu_ps(lanes, _mm_add_ps(offsets[0][r], offsets[1][r]));
      out[r * out_stride + i] = _mm512_reduce_add_ps(_mm512_add_ps(acc[0][r], acc[1][r])) + lanes[2] + lanes[3];
    }
  }
}

// A block's 8 vectors of codes (4 values of 16 rows each) against its 32 activation digits q: lane j of dots[h]
// sums row j's 16 products of half h (Q6_K's scale changes every 16 values). The halves are two chains of sums, so
// that one vpdpbusd need not wait for the last.
inline void half_dots(const __m512i (&codes)[8], const int8_t* q, __m512i (&dots)[2]) {
  dots[0] = dots[1] = _mm512_setzero_si512();
  for (int c = 0; c < 8; ++c) {
    int32_t four;
    std::memcpy(&four, q + 4 * c, 4);
    dots[c / 4] = _mm512_dpbusd_epi32(dots[c / 4], codes[c], _mm512_set1_epi32(four));
  }
}

// The same summed over the block: lane j holds row j's 32 products.
inline __m512i codes_dot(const __m512i (&codes)[8], const int8_t* q) {
  __m512i dots[2];
  half_dots(codes, q, dots);
  return _mm512_add_epi32(dots[0], dots[1]);
}

// The 16-row tiles (kernels/cpu/packed_weight.h): per block of 32 values, 8 vectors of codes, each 4 values of
// the 16 rows (rows16_block_codes), multiplied with 4 bytes of an activation row broadcast; lane j sums weight row
// j. So 512 products (a block of 16 rows) cost an activation row 8 vpdpbusd, a conversion, a multiply and two
// multiply-adds, where the pair groups cost it 7 instructions for every 64; the weight side (4 or 8 loads, 8 masks
// for u4, and for k4_rows16 the scales and mins) is shared by the tile's activation rows. Block b of the 16 rows
// with their d_w and m_w: acc[r] += d_w * d_r (u . q_r), offsets[r] += m_w * s_r. With two digits (int16
// activations) each digit takes its 8 vpdpbusd and u . q = 256 (u . q_high) + (u . q_low), exact in 32 bits.
template <int R, int Digits>
inline void rows16_block_into(const __m512i (&codes)[8], __m512 d, __m512 m, const IntegerActivations& x, int64_t a0,
                              int64_t b, __m512 (&acc)[R], __m512 (&offsets)[R]) {
  for (int r = 0; r < R; ++r) {
    const float* scales = x.row_scales(a0 + r) + 4 * (b / 2);  // d0, d1, s0, s1 of the block's pair
    __m512 sum;
    if constexpr (Digits == 2) {
      const __m512i high = codes_dot(codes, x.row_values(a0 + r) + 32 * b);
      const __m512i low = codes_dot(codes, x.row_low_values(a0 + r) + 32 * b);
      sum = _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_slli_epi32(high, 8), low));
    } else {
      sum = _mm512_cvtepi32_ps(codes_dot(codes, x.row_values(a0 + r) + 32 * b));
    }
    acc[r] = _mm512_fmadd_ps(sum, _mm512_mul_ps(d, _mm512_set1_ps(scales[b % 2])), acc[r]);
    offsets[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(scales[2 + b % 2]), offsets[r]);
  }
}

// A block of 32 values of k6_rows16 (kernels/cpu/packed_weight.h) at `sub`, of the 16 rows with their d_super: the
// 6-bit codes are the low nibbles with the high 2 bits or-ed in (a shift and a ternary logic op per vector); each
// half of 16 values has its own scale, so the products sum in two chains, one per half, and the -32 of
// y = d scale (u - 32) goes to the offsets with the activations' half sums. Two digits as in rows16_block_into.
template <int R, int Digits>
inline void k6_block_into(const uint8_t* sub, __m512 d_super, const IntegerActivations& x, int64_t a0, int64_t b,
                          __m512 (&acc)[R], __m512 (&offsets)[R]) {
  const __m512 d_half[2] = {_mm512_mul_ps(d_super, row_signed_bytes_ps(sub)),
                            _mm512_mul_ps(d_super, row_signed_bytes_ps(sub + 16))};
  const __m512i high_bits = _mm512_set1_epi8(0x30);
  const __m512i high[2] = {_mm512_loadu_si512(sub + kK6Rows16HighBits),
                           _mm512_loadu_si512(sub + kK6Rows16HighBits + 64)};
  __m512i codes[8];
  rows16_block_codes<true, false>(sub + 32, nullptr, codes);
  for (int c = 0; c < 8; ++c) {  // bits 2 (c % 4) of high[c / 4] to bits 4-5
    const __m512i h = high[c / 4];
    const __m512i at_4 = c % 4 == 0 ? _mm512_slli_epi16(h, 4)
                         : c % 4 == 1 ? _mm512_slli_epi16(h, 2)
                         : c % 4 == 2 ? h
                                      : _mm512_srli_epi16(h, 2);
    codes[c] = _mm512_ternarylogic_epi32(codes[c], at_4, high_bits, 0xF8);  // codes | (at_4 & 0x30)
  }
  for (int r = 0; r < R; ++r) {
    const float d_x = x.row_scales(a0 + r)[4 * (b / 2) + b % 2];
    const float* half_sums = x.row_half_sums(a0 + r) + 2 * b;
    __m512i dots[2];
    half_dots(codes, x.row_values(a0 + r) + 32 * b, dots);
    if constexpr (Digits == 2) {
      __m512i low[2];
      half_dots(codes, x.row_low_values(a0 + r) + 32 * b, low);
      for (int h = 0; h < 2; ++h) dots[h] = _mm512_add_epi32(_mm512_slli_epi32(dots[h], 8), low[h]);
    }
    for (int h = 0; h < 2; ++h) {
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots[h]), _mm512_mul_ps(d_half[h], _mm512_set1_ps(d_x)), acc[r]);
      offsets[r] = _mm512_fmadd_ps(d_half[h], _mm512_set1_ps(-32.0f * half_sums[h]), offsets[r]);
    }
  }
}

// The tiles of [row_begin, row_end) against rows a0 .. a0 + R of x, block by block (for_each_rows16_block; k6_rows16
// by its halves).
template <int R, int Digits, PackedLayout Layout>
void rows16_tiles(const PackedWeight& w, int64_t row_begin, int64_t row_end, const IntegerActivations& x, int64_t a0,
                  float* out, int64_t out_stride) {
  const WeightPrefetch prefetch = tile_prefetch(x.rows);
  for (int64_t t = row_begin / kTileRows16; t < row_end / kTileRows16; ++t) {
    const uint8_t* tile = w.data + t * kTileRows16 * w.row_bytes;
    __m512 acc[R], offsets[R];
    for (int r = 0; r < R; ++r) acc[r] = offsets[r] = _mm512_setzero_ps();
    if constexpr (Layout == PackedLayout::k6_rows16) {
      for (int64_t sb = 0; sb < w.cols / 256; ++sb) {
        const uint8_t* super = tile + sb * kK6Rows16SuperBytes;
        const __m512 d_super = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(super)));
        for (int64_t j = 0; j < 8; ++j) {
          const uint8_t* sub = super + 32 + j * kK6Rows16SubBytes;
          prefetch_ahead<kK6Rows16SubBytes>(sub, prefetch);
          k6_block_into<R, Digits>(sub, d_super, x, a0, 8 * sb + j, acc, offsets);
        }
      }
    } else {
      const auto block_into = [&](const __m512i (&codes)[8], __m512 d, __m512 m, int64_t b) {
        rows16_block_into<R, Digits>(codes, d, m, x, a0, b, acc, offsets);
      };
      for_each_rows16_block<Layout>(tile, 0, w.cols / 32, prefetch, block_into);
    }
    for (int r = 0; r < R; ++r) {
      _mm512_storeu_ps(out + r * out_stride + t * kTileRows16, _mm512_add_ps(acc[r], offsets[r]));
    }
  }
}

template <int R, int Digits>
void vnni_tile(int64_t rows, const PackedWeight& w, int64_t row_begin, int64_t row_end, const IntegerActivations& x,
               int64_t a0, float* out, int64_t out_stride) {
  if constexpr (R > 1) {
    if (rows < R) return vnni_tile<R - 1, Digits>(rows, w, row_begin, row_end, x, a0, out, out_stride);
  }
  switch (w.layout) {
    case PackedLayout::u4_pairs: return vnni_rows<R, true, Digits>(w, row_begin, row_end, x, a0, out, out_stride);
    case PackedLayout::u8_pairs: return vnni_rows<R, false, Digits>(w, row_begin, row_end, x, a0, out, out_stride);
    case PackedLayout::u4_rows16:
      return rows16_tiles<R, Digits, PackedLayout::u4_rows16>(w, row_begin, row_end, x, a0, out, out_stride);
    case PackedLayout::u8_rows16:
      return rows16_tiles<R, Digits, PackedLayout::u8_rows16>(w, row_begin, row_end, x, a0, out, out_stride);
    case PackedLayout::k4_rows16:
      return rows16_tiles<R, Digits, PackedLayout::k4_rows16>(w, row_begin, row_end, x, a0, out, out_stride);
    case PackedLayout::k5_rows16:
      return rows16_tiles<R, Digits, PackedLayout::k5_rows16>(w, row_begin, row_end, x, a0, out, out_stride);
    case PackedLayout::k6_rows16:
      return rows16_tiles<R, Digits, PackedLayout::k6_rows16>(w, row_begin, row_end, x, a0, out, out_stride);
    default: return;  // quantized_matmul sends only these layouts to the integer kernels
  }
}

}  // namespace

void quantized_dot_int8_avx512_vnni(const PackedWeight& w, int64_t row_begin, int64_t row_end,
                                    const IntegerActivations& x, float* out, int64_t out_stride) {
  const int64_t max_rows = x.digits == 2 ? kMaxRowsTwoDigits : kMaxRows;
  for (int64_t a = 0; a < x.rows; a += max_rows) {
    const int64_t rows = x.rows - a < max_rows ? x.rows - a : max_rows;
    if (x.digits == 2) {
      vnni_tile<kMaxRowsTwoDigits, 2>(rows, w, row_begin, row_end, x, a, out + a * out_stride, out_stride);
    } else {
      vnni_tile<kMaxRows, 1>(rows, w, row_begin, row_end, x, a, out + a * out_stride, out_stride);
    }
  }
}

}  // namespace strata::cpu

#pragma GCC diagnostic pop
#pragma GCC pop_options

#endif
