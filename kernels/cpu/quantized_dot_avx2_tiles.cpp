// The integer kernel on the 16-row tiles (kernels/cpu/packed_weight.h) for x86-64-v3 (AVX2, FMA, F16C): the machines
// without AVX-512 VNNI (AMD before Zen 4, Intel client cores, AVX-512 without VNNI), with one digit (int8
// activations) or two (int16; kernels/cpu/integer_activations.h). The VNNI kernel's scheme
// (kernels/cpu/quantized_dot_avx512_vnni.cpp) at half the width and without vpdpbusd:
//
// A tile is taken 8 rows at a time (the lanes of a ymm). Per block of 32 values, each of its 8 code vectors (4
// values of the 8 rows) is multiplied with 4 activation bytes broadcast by vpmaddubsw (unsigned x signed bytes,
// adjacent products summed into 16 bits), and the 16-bit sums of the block add up in 16 bits before one vpmaddwd
// widens them to 32: at most 8 x 2 x 15 x 128 = 30,720 for 4-bit codes, so nothing saturates; Q6_K's 6-bit codes
// are summed two vectors at a time (at most 2 x 2 x 63 x 128 = 32,256), Q5_K's 5-bit ones four at a time (at most
// 4 x 2 x 31 x 128 = 31,744). The vpmaddwd that widens multiplies by the
// digit's weight at once (256 for q_high), so the block's sum is exact in 32 bits as on VNNI, and the conversion,
// scaling and offsets that follow are the VNNI kernel's, in its order: both kernels give the same floats.
//
// Q8_0 has no tiles here: its 8-bit codes would saturate vpmaddubsw's pair sums, and split into nibbles they ran
// slower than its pairs (kernels/cpu/quantized_dot_avx2.cpp) at every row count, so the CPU backend keeps it in
// pairs at this level (CpuBackend::pair_packing); a u8 tile (the tests') takes the baseline kernel.
#include "kernels/cpu/integer_activations.h"
#include "kernels/cpu/quantized_dot.h"
#include "kernels/cpu/weight_prefetch.h"

#if STRATA_QUANTIZED_DOT_X86
#include <immintrin.h>

#include <cstring>

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

namespace strata::cpu {
namespace {

// Activation rows per pass over a tile's half: its 8 code vectors and the rows' sums and offsets share the 16
// registers.
constexpr int kMaxRows = 2;

inline __m256i broadcast_four(const int8_t* q) {
  int32_t four;
  std::memcpy(&four, q, 4);
  return _mm256_set1_epi32(four);
}

// The 16-bit pair sums of codes[c] . q[4c .. 4c + 3] over c in [begin, end), lane j of row j.
template <int N>
inline __m256i pair_sums(const __m256i (&codes)[N], int begin, int end, const int8_t* q) {
  __m256i sum = _mm256_maddubs_epi16(codes[begin], broadcast_four(q + 4 * begin));
  for (int c = begin + 1; c < end; ++c) {
    sum = _mm256_add_epi16(sum, _mm256_maddubs_epi16(codes[c], broadcast_four(q + 4 * c)));
  }
  return sum;
}

// The sum of the block's products with every digit of a row of x: u . q, q = 256 q_high + q_low; the vpmaddwd that
// widens the 16-bit sums, of Span code vectors each, multiplies them by the digit's weight.
template <int Digits, int Span>
inline __m256i digits_dot(const __m256i (&codes)[8], const int8_t* high, const int8_t* low) {
  __m256i sum = _mm256_setzero_si256();
  for (int digit = 0; digit < Digits; ++digit) {
    const __m256i weight = _mm256_set1_epi16(Digits == 2 && digit == 0 ? 256 : 1);
    for (int c = 0; c < 8; c += Span) {
      sum = _mm256_add_epi32(sum, _mm256_madd_epi16(pair_sums(codes, c, c + Span, digit == 0 ? high : low), weight));
    }
  }
  return sum;
}

// 8 bytes (one per row of a tile's half) as fp32, unsigned or signed.
inline __m256 row_bytes_ps(const uint8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
inline __m256 row_signed_bytes_ps(const uint8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
inline __m256 row_halves_ps(const uint8_t* p) {  // 8 f16
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// Block b of half `half` of a u4, k4 or k5 tile (`values`: its codes; `fifth`: k5's fifth bits, bit c of a byte for
// code vector c) with the 8 rows' d and m against rows a0 .. a0 + R of x: acc[r] += d d_r (u . q_r),
// offsets[r] += m s_r.
template <int R, int Digits, bool FifthBit = false>
inline void block_into(const uint8_t* values, int half, __m256 d, __m256 m, const IntegerActivations& x, int64_t a0,
                       int64_t b, __m256 (&acc)[R], __m256 (&offsets)[R], const uint8_t* fifth = nullptr) {
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  __m256i codes[8];
  for (int c = 0; c < 4; ++c) {  // values 4c + k in the low nibbles, 16 + 4c + k in the high ones
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(values + 64 * c + 32 * half));
    codes[c] = _mm256_and_si256(v, nibble);
    codes[4 + c] = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
  }
  if constexpr (FifthBit) {
    const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(fifth + 32 * half));
    const __m256i bit_4 = _mm256_set1_epi8(0x10);
    for (int c = 0; c < 8; ++c) {  // bit c of each byte to bit 4; shifts within 16-bit lanes keep a byte's own
      const __m256i at_4 = c < 4 ? _mm256_slli_epi16(bits, 4 - c) : _mm256_srli_epi16(bits, c - 4);
      codes[c] = _mm256_or_si256(codes[c], _mm256_and_si256(at_4, bit_4));
    }
  }
  for (int r = 0; r < R; ++r) {
    const float* scales = x.row_scales(a0 + r) + 4 * (b / 2);  // d0, d1, s0, s1 of the block's pair
    const __m256i dot = digits_dot<Digits, FifthBit ? 4 : 8>(
        codes, x.row_values(a0 + r) + 32 * b, Digits == 2 ? x.row_low_values(a0 + r) + 32 * b : nullptr);
    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(d, _mm256_set1_ps(scales[b % 2])), acc[r]);
    offsets[r] = _mm256_fmadd_ps(m, _mm256_set1_ps(scales[2 + b % 2]), offsets[r]);
  }
}

// The same for block b of half `half` of a k6 tile at `sub` (kernels/cpu/packed_weight.h, and k6_block_into in the
// VNNI kernel): 6-bit codes, a scale per 16 values, y = d_super scale (u - 32).
template <int R, int Digits>
inline void k6_block_into(const uint8_t* sub, int half, __m256 d_super, const IntegerActivations& x, int64_t a0,
                          int64_t b, __m256 (&acc)[R], __m256 (&offsets)[R]) {
  const __m256 d_half[2] = {_mm256_mul_ps(d_super, row_signed_bytes_ps(sub + 8 * half)),
                            _mm256_mul_ps(d_super, row_signed_bytes_ps(sub + 16 + 8 * half))};
  const __m256i nibble = _mm256_set1_epi8(0x0F), high_bits = _mm256_set1_epi8(0x30);
  __m256i codes[8];
  for (int c = 0; c < 4; ++c) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sub + 32 + 64 * c + 32 * half));
    codes[c] = _mm256_and_si256(v, nibble);
    codes[4 + c] = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
  }
  for (int c = 0; c < 8; ++c) {  // bits 2 (c % 4) of the high bits to bits 4-5
    const __m256i h = _mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(sub + kK6Rows16HighBits + 64 * (c / 4) + 32 * half));
    const __m256i at_4 = c % 4 == 0 ? _mm256_slli_epi16(h, 4)
                         : c % 4 == 1 ? _mm256_slli_epi16(h, 2)
                         : c % 4 == 2 ? h
                                      : _mm256_srli_epi16(h, 2);
    codes[c] = _mm256_or_si256(codes[c], _mm256_and_si256(at_4, high_bits));
  }
  for (int r = 0; r < R; ++r) {
    const float d_x = x.row_scales(a0 + r)[4 * (b / 2) + b % 2];
    const float* half_sums = x.row_half_sums(a0 + r) + 2 * b;
    const int8_t* q[2] = {x.row_values(a0 + r) + 32 * b, Digits == 2 ? x.row_low_values(a0 + r) + 32 * b : nullptr};
    for (int h = 0; h < 2; ++h) {  // values 16h .. 16h + 15: code vectors 4h .. 4h + 3
      __m256i dot = _mm256_setzero_si256();
      for (int digit = 0; digit < Digits; ++digit) {
        const __m256i weight = _mm256_set1_epi16(Digits == 2 && digit == 0 ? 256 : 1);
        for (int c = 4 * h; c < 4 * h + 4; c += 2) {
          dot = _mm256_add_epi32(dot, _mm256_madd_epi16(pair_sums(codes, c, c + 2, q[digit]), weight));
        }
      }
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(d_half[h], _mm256_set1_ps(d_x)), acc[r]);
      offsets[r] = _mm256_fmadd_ps(d_half[h], _mm256_set1_ps(-32.0f * half_sums[h]), offsets[r]);
    }
  }
}

// Halves [first, first + Halves) of the tiles of [row_begin, row_end) (half h: rows 8h .. 8h + 7) against rows
// a0 .. a0 + R of x. A lone row of x takes both halves in one pass over the tile's bytes; more rows take one half
// a pass, so that the half's codes stay in registers for every row.
template <int R, int Digits, PackedLayout Layout, int Halves>
void tile_halves(const PackedWeight& w, int64_t row_begin, int64_t row_end, int first, const IntegerActivations& x,
                 int64_t a0, float* out, int64_t out_stride) {
  const WeightPrefetch prefetch = tile_prefetch(x.rows);
  for (int64_t t = row_begin / kTileRows16; t < row_end / kTileRows16; ++t) {
    const uint8_t* tile = w.data + t * kTileRows16 * w.row_bytes;
    __m256 acc[Halves][R], offsets[Halves][R];
    for (int h = 0; h < Halves; ++h) {
      for (int r = 0; r < R; ++r) acc[h][r] = offsets[h][r] = _mm256_setzero_ps();
    }
    if constexpr (Layout == PackedLayout::k6_rows16) {
      for (int64_t sb = 0; sb < w.cols / 256; ++sb) {
        const uint8_t* super = tile + sb * kK6Rows16SuperBytes;
        __m256 d_super[Halves];
        for (int h = 0; h < Halves; ++h) d_super[h] = row_halves_ps(super + 16 * (first + h));
        for (int64_t j = 0; j < 8; ++j) {
          const uint8_t* sub = super + 32 + j * kK6Rows16SubBytes;
          prefetch_ahead<kK6Rows16SubBytes>(sub, prefetch);
          for (int h = 0; h < Halves; ++h) {
            k6_block_into<R, Digits>(sub, first + h, d_super[h], x, a0, 8 * sb + j, acc[h], offsets[h]);
          }
        }
      }
    } else if constexpr (Layout == PackedLayout::k4_rows16 || Layout == PackedLayout::k5_rows16) {
      constexpr bool kK5 = Layout == PackedLayout::k5_rows16;
      constexpr int64_t kSuperBytes = kK5 ? kK5Rows16SuperBytes : kK4Rows16SuperBytes;
      constexpr int64_t kSubBytes = kK5 ? kK5Rows16SubBytes : kK4Rows16SubBytes;
      for (int64_t sb = 0; sb < w.cols / 256; ++sb) {
        const uint8_t* super = tile + sb * kSuperBytes;
        __m256 d_super[Halves], dmin[Halves];
        for (int h = 0; h < Halves; ++h) {
          d_super[h] = row_halves_ps(super + 16 * (first + h));
          dmin[h] = row_halves_ps(super + 32 + 16 * (first + h));
        }
        for (int64_t j = 0; j < 8; ++j) {
          const uint8_t* sub = super + 64 + j * kSubBytes;
          prefetch_ahead<kSubBytes>(sub, prefetch);
          for (int h = 0; h < Halves; ++h) {
            const int half = first + h;
            const __m256 d = _mm256_mul_ps(d_super[h], row_bytes_ps(sub + 8 * half));
            const __m256 m =
                _mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(dmin[h], row_bytes_ps(sub + 16 + 8 * half)));
            block_into<R, Digits, kK5>(sub + 32, half, d, m, x, a0, 8 * sb + j, acc[h], offsets[h],
                                       sub + kK5Rows16FifthBits);
          }
        }
      }
    } else {
      for (int64_t b = 0; b < w.cols / 32; ++b) {
        const uint8_t* block = tile + b * kU4Rows16BlockBytes;
        prefetch_ahead<kU4Rows16BlockBytes>(block, prefetch);
        for (int h = 0; h < Halves; ++h) {
          const int half = first + h;
          block_into<R, Digits>(block + 64, half, row_halves_ps(block + 16 * half),
                                row_halves_ps(block + 32 + 16 * half), x, a0, b, acc[h], offsets[h]);
        }
      }
    }
    for (int h = 0; h < Halves; ++h) {
      for (int r = 0; r < R; ++r) {
        _mm256_storeu_ps(out + r * out_stride + t * kTileRows16 + 8 * (first + h),
                         _mm256_add_ps(acc[h][r], offsets[h][r]));
      }
    }
  }
}

template <int R, int Digits, PackedLayout Layout>
void tiles_of_layout(const PackedWeight& w, int64_t row_begin, int64_t row_end, const IntegerActivations& x, int64_t a0,
                     float* out, int64_t out_stride) {
  if constexpr (R == 1) {
    tile_halves<1, Digits, Layout, 2>(w, row_begin, row_end, 0, x, a0, out, out_stride);
  } else {
    for (int half = 0; half < 2; ++half) {
      tile_halves<R, Digits, Layout, 1>(w, row_begin, row_end, half, x, a0, out, out_stride);
    }
  }
}

template <int R, int Digits>
void tiles_pass(int64_t rows, const PackedWeight& w, int64_t row_begin, int64_t row_end, const IntegerActivations& x,
                int64_t a0, float* out, int64_t out_stride) {
  if constexpr (R > 1) {
    if (rows < R) return tiles_pass<R - 1, Digits>(rows, w, row_begin, row_end, x, a0, out, out_stride);
  }
  switch (w.layout) {
    case PackedLayout::u4_rows16:
      return tiles_of_layout<R, Digits, PackedLayout::u4_rows16>(w, row_begin, row_end, x, a0, out, out_stride);
    case PackedLayout::k4_rows16:
      return tiles_of_layout<R, Digits, PackedLayout::k4_rows16>(w, row_begin, row_end, x, a0, out, out_stride);
    case PackedLayout::k5_rows16:
      return tiles_of_layout<R, Digits, PackedLayout::k5_rows16>(w, row_begin, row_end, x, a0, out, out_stride);
    case PackedLayout::k6_rows16:
      return tiles_of_layout<R, Digits, PackedLayout::k6_rows16>(w, row_begin, row_end, x, a0, out, out_stride);
    default: return;  // quantized_dot_int8_avx2 sends only these layouts here
  }
}

}  // namespace

void quantized_dot_rows16_avx2(const PackedWeight& w, int64_t row_begin, int64_t row_end, const IntegerActivations& x,
                               float* out, int64_t out_stride) {
  for (int64_t a = 0; a < x.rows; a += kMaxRows) {
    const int64_t rows = x.rows - a < kMaxRows ? x.rows - a : kMaxRows;
    if (x.digits == 2) {
      tiles_pass<kMaxRows, 2>(rows, w, row_begin, row_end, x, a, out + a * out_stride, out_stride);
    } else {
      tiles_pass<kMaxRows, 1>(rows, w, row_begin, row_end, x, a, out + a * out_stride, out_stride);
    }
  }
}

}  // namespace strata::cpu

#pragma GCC pop_options

#endif
