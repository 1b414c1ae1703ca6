// KIVI blocks dequantized with AVX2, FMA and F16C (kernels/cpu/kv_quantization.h): what attention does with a
// quantized block on every decode step, so it is worth its own code. The portable bodies in kv_quantization.cpp
// leave the byte-to-float widening and the interleaving of a byte's two or four channels to the compiler, which
// does them a lane at a time; here 32 channels are 4 ymm of floats: the codes unpacked with masks and shifts,
// interleaved into channel order as bytes (punpck), widened (vpmovzxbd), converted and put through min + code *
// scale in one fused multiply-add. Everything after the includes is compiled for that level by the pragma, so
// that no inline function of a header carries AVX2 code into baseline callers.
#include "kernels/cpu/kv_quantization.h"
#include "kernels/cpu/quantized_dot.h"

#if STRATA_QUANTIZED_DOT_X86
#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

namespace strata::cpu {
namespace {

// The codes of channels [c, c + 32) of a code row (c a multiple of 32), a byte each, in channel order across two
// xmm; in the row, channel i * 8 / kBits + k sits in bits k * kBits of byte i (put_code).
template <int kBits>
inline void channel_codes(const uint8_t* row, int c, __m128i& first, __m128i& second) {
  if constexpr (kBits == 8) {
    first = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + c));
    second = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + c + 16));
  } else if constexpr (kBits == 4) {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + c / 2));
    const __m128i mask = _mm_set1_epi8(0x0F);
    const __m128i low = _mm_and_si128(bytes, mask), high = _mm_and_si128(_mm_srli_epi16(bytes, 4), mask);
    first = _mm_unpacklo_epi8(low, high);
    second = _mm_unpackhi_epi8(low, high);
  } else {
    static_assert(kBits == 2);
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + c / 4));
    const __m128i mask = _mm_set1_epi8(0x03);
    const __m128i p0 = _mm_and_si128(bytes, mask), p1 = _mm_and_si128(_mm_srli_epi16(bytes, 2), mask);
    const __m128i p2 = _mm_and_si128(_mm_srli_epi16(bytes, 4), mask);
    const __m128i p3 = _mm_and_si128(_mm_srli_epi16(bytes, 6), mask);
    const __m128i p01 = _mm_unpacklo_epi8(p0, p1), p23 = _mm_unpacklo_epi8(p2, p3);  // byte pairs of channels
    first = _mm_unpacklo_epi16(p01, p23);
    second = _mm_unpackhi_epi16(p01, p23);
  }
}

// 8 codes (the low 8 bytes of `codes`) as floats.
inline __m256 widen(__m128i codes) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(codes)); }

// min + code * scale for the 32 channels of a row from c, with per-channel (keys) or per-row (values) scales.
template <int kBits>
inline void dequantize_group(const uint8_t* row, int c, const __m256 (&scale)[4], const __m256 (&min)[4], float* out) {
  __m128i first, second;
  channel_codes<kBits>(row, c, first, second);
  const __m256 codes[4] = {widen(first), widen(_mm_unpackhi_epi64(first, first)), widen(second),
                           widen(_mm_unpackhi_epi64(second, second))};
  for (int j = 0; j < 4; ++j) _mm256_storeu_ps(out + 8 * j, _mm256_fmadd_ps(codes[j], scale[j], min[j]));
}

// 8 stored scales or mins (fp16) as floats.
inline __m256 load_scales8(const uint16_t* stored) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(stored)));
}

template <int kBits>
void keys(const uint8_t* block, int head, int first, int n, const KvBlockLayout& L, float* out) {
  const auto* scale = reinterpret_cast<const uint16_t*>(block + L.k_scale_offset(head));
  const auto* min = reinterpret_cast<const uint16_t*>(block + L.k_min_offset(head));
  const uint8_t* rows = block + L.k_codes_offset(head, first);
  const int64_t row_bytes = L.code_row_bytes(), hd = L.head_dim;
  for (int c = 0; c < hd; c += kKvQuantGroup) {
    __m256 s[4], b[4];
    for (int j = 0; j < 4; ++j) {
      s[j] = load_scales8(scale + c + 8 * j);
      b[j] = load_scales8(min + c + 8 * j);
    }
    for (int t = 0; t < n; ++t) dequantize_group<kBits>(rows + t * row_bytes, c, s, b, out + t * hd + c);
  }
}

template <int kBits>
void values(const uint8_t* block, int head, int first, int n, const KvBlockLayout& L, float* out) {
  const int groups = L.v_groups();
  const auto* scale = reinterpret_cast<const uint16_t*>(block + L.v_scale_offset(head, first));
  const auto* min = reinterpret_cast<const uint16_t*>(block + L.v_min_offset(head, first));
  const uint8_t* rows = block + L.v_codes_offset(head, first);
  const int64_t row_bytes = L.code_row_bytes(), hd = L.head_dim;
  for (int t = 0; t < n; ++t) {
    for (int g = 0; g < groups; ++g) {
      // F16C converts 8 at a time; a group's one scale and min are broadcast.
      const __m128i pair = _mm_setr_epi16(int16_t(scale[t * groups + g]), int16_t(min[t * groups + g]), 0, 0, 0, 0,
                                          0, 0);
      const __m128 both = _mm_cvtph_ps(pair);
      const __m256 s = _mm256_broadcastss_ps(both), b = _mm256_broadcastss_ps(_mm_movehdup_ps(both));
      const __m256 s4[4] = {s, s, s, s}, b4[4] = {b, b, b, b};
      dequantize_group<kBits>(rows + t * row_bytes, g * kKvQuantGroup, s4, b4, out + t * hd + g * kKvQuantGroup);
    }
  }
}

}  // namespace

void dequantize_keys_avx2(const uint8_t* block, int head, int first, int n, const KvBlockLayout& L, float* out) {
  switch (L.quant) {
    case KvQuant::int8: return keys<8>(block, head, first, n, L, out);
    case KvQuant::int4: return keys<4>(block, head, first, n, L, out);
    case KvQuant::int2: return keys<2>(block, head, first, n, L, out);
    case KvQuant::none: break;
  }
}

void dequantize_values_avx2(const uint8_t* block, int head, int first, int n, const KvBlockLayout& L, float* out) {
  switch (L.quant) {
    case KvQuant::int8: return values<8>(block, head, first, n, L, out);
    case KvQuant::int4: return values<4>(block, head, first, n, L, out);
    case KvQuant::int2: return values<2>(block, head, first, n, L, out);
    case KvQuant::none: break;
  }
}

}  // namespace strata::cpu

#pragma GCC pop_options
#endif
