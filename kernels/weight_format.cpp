#include "kernels/weight_format.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/cpu/simd_clones.h"

// GCC only, as STRATA_SIMD_CLONES (Clang's __builtin_cpu_supports does not know "f16c"; the fuzzing build is Clang).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#define STRATA_F16C 1
#include <immintrin.h>
#endif

namespace strata {
namespace {

constexpr WeightFormatInfo kInfo[] = {
    {"f32", 1, 4}, {"q8_0", 32, 34}, {"q4_0", 32, 18}, {"q4_1", 32, 20}, {"q4_k", 256, 144}, {"q6_k", 256, 210},
    {"q5_k", 256, 176}, {"q5_1", 32, 24},   {"f16", 1, 2},      {"bf16", 1, 2},
};

uint16_t load_u16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

#if STRATA_F16C
// n halves to fp32 by F16C, 8 at a time: one instruction where fp16_to_fp32's vectorized loop takes about six.
// Attention over an f16 KV pool widens every entry it reads (with ask_share, decode after 4,096 entries 1.19x and
// 1.27x as fast: bench/results/README.md). The same values as fp16_to_fp32, but that a signaling NaN comes back
// quiet.
__attribute__((target("avx,f16c"))) void widen_halves_f16c(const uint8_t* b, int64_t n, float* dst) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2 * i))));
  }
  for (; i < n; ++i) dst[i] = fp16_to_fp32(load_u16(b + 2 * i));
}

bool has_f16c() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
  }();
  return has;
}
#endif

// n f16 or bf16 values to fp32, in loops each level's clone vectorizes: prefill widens every 16-bit weight it
// multiplies into fp32 tiles (kernels/cpu/packed_weight.h); with the portable loop SmolLM2's F16 prefill ran at 0.73x
// of fp32 weights'.
STRATA_SIMD_CLONES void widen_halves(const uint8_t* b, bool bf16, int64_t n, float* dst) {
  if (bf16) {
    for (int64_t i = 0; i < n; ++i) dst[i] = std::bit_cast<float>(uint32_t(load_u16(b + 2 * i)) << 16);
    return;
  }
#if STRATA_F16C
  if (has_f16c()) return widen_halves_f16c(b, n, dst);
#endif
  for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(load_u16(b + 2 * i));
}

// Block structs are packed byte arrays in the file; reading fields byte-wise keeps this independent of the
// host's alignment rules (the data of a row may start at any offset).
void dequantize_q4_0(const uint8_t* b, float* y, int64_t n_blocks) {
  for (int64_t i = 0; i < n_blocks; ++i, b += 18, y += 32) {
    const float d = fp16_to_fp32(load_u16(b));
    const uint8_t* qs = b + 2;
    for (int j = 0; j < 16; ++j) {
      y[j] = static_cast<float>((qs[j] & 0xF) - 8) * d;
      y[j + 16] = static_cast<float>((qs[j] >> 4) - 8) * d;
    }
  }
}

void dequantize_q4_1(const uint8_t* b, float* y, int64_t n_blocks) {
  for (int64_t i = 0; i < n_blocks; ++i, b += 20, y += 32) {
    const float d = fp16_to_fp32(load_u16(b));
    const float m = fp16_to_fp32(load_u16(b + 2));
    const uint8_t* qs = b + 4;
    for (int j = 0; j < 16; ++j) {
      y[j] = static_cast<float>(qs[j] & 0xF) * d + m;
      y[j + 16] = static_cast<float>(qs[j] >> 4) * d + m;
    }
  }
}

void dequantize_q8_0(const uint8_t* b, float* y, int64_t n_blocks) {
  for (int64_t i = 0; i < n_blocks; ++i, b += 34, y += 32) {
    const float d = fp16_to_fp32(load_u16(b));
    const int8_t* qs = reinterpret_cast<const int8_t*>(b + 2);
    for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(qs[j]) * d;
  }
}

void dequantize_q4_k(const uint8_t* b, float* y, int64_t n_blocks) {
  for (int64_t i = 0; i < n_blocks; ++i, b += 144, y += 256) dequantize_k_quant_block(b, b + 16, nullptr, y);
}

void dequantize_q5_k(const uint8_t* b, float* y, int64_t n_blocks) {
  for (int64_t i = 0; i < n_blocks; ++i, b += 176, y += 256) dequantize_k_quant_block(b, b + 48, b + 16, y);
}

void dequantize_q5_1(const uint8_t* b, float* y, int64_t n_blocks) {
  for (int64_t i = 0; i < n_blocks; ++i, b += 24, y += 32) {
    const float d = fp16_to_fp32(load_u16(b));
    const float m = fp16_to_fp32(load_u16(b + 2));
    uint8_t u[32];
    q5_1_values(b, u);
    for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(u[j]) * d + m;
  }
}

void dequantize_q6_k(const uint8_t* b, float* y, int64_t n_blocks) {
  for (int64_t i = 0; i < n_blocks; ++i, b += 210) {
    const uint8_t* ql = b;
    const uint8_t* qh = b + 128;
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
    const float d = fp16_to_fp32(load_u16(b + 208));
    for (int half = 0; half < 2; ++half, ql += 64, qh += 32, sc += 8, y += 128) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
        y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
        y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
        y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
      }
    }
  }
}

}  // namespace

const WeightFormatInfo& weight_format_info(WeightFormat format) {
  const auto i = static_cast<size_t>(format);
  if (i >= std::size(kInfo)) throw std::invalid_argument("unknown weight format " + std::to_string(i));
  return kInfo[i];
}

int64_t WeightMatrix::row_bytes() const {
  const WeightFormatInfo& info = weight_format_info(format);
  return cols / info.block_elements * info.block_bytes;
}

const float* WeightMatrix::f32() const {
  if (format != WeightFormat::f32) {
    throw std::logic_error("weight matrix is " + std::string(weight_format_info(format).name) + ", not f32");
  }
  return static_cast<const float*>(data);
}

void dequantize_weight_row(WeightFormat format, const void* src, float* dst, int64_t n) {
  const WeightFormatInfo& info = weight_format_info(format);
  if (n < 0 || n % info.block_elements != 0) {
    throw std::invalid_argument(std::to_string(n) + " values is not a multiple of the " + std::string(info.name) +
                                " block size " + std::to_string(info.block_elements));
  }
  const auto* b = static_cast<const uint8_t*>(src);
  const int64_t n_blocks = n / info.block_elements;
  switch (format) {
    case WeightFormat::f32: std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float)); break;
    case WeightFormat::q8_0: dequantize_q8_0(b, dst, n_blocks); break;
    case WeightFormat::q4_0: dequantize_q4_0(b, dst, n_blocks); break;
    case WeightFormat::q4_1: dequantize_q4_1(b, dst, n_blocks); break;
    case WeightFormat::q4_k: dequantize_q4_k(b, dst, n_blocks); break;
    case WeightFormat::q5_k: dequantize_q5_k(b, dst, n_blocks); break;
    case WeightFormat::q6_k: dequantize_q6_k(b, dst, n_blocks); break;
    case WeightFormat::q5_1: dequantize_q5_1(b, dst, n_blocks); break;
    case WeightFormat::f16: widen_halves(b, false, n, dst); break;
    case WeightFormat::bf16: widen_halves(b, true, n, dst); break;
  }
}

void quantize_row_q8_0(const float* src, void* dst, int64_t n) {
  if (n < 0 || n % 32 != 0) throw std::invalid_argument(std::to_string(n) + " values is not a multiple of 32");
  auto* b = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n; i += 32, src += 32, b += 34) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(src[j]));
    const float d = amax / 127.0f;
    const float inv = d != 0.0f ? 1.0f / d : 0.0f;
    const uint16_t d16 = fp32_to_fp16(d);
    b[0] = uint8_t(d16 & 0xFF);
    b[1] = uint8_t(d16 >> 8);
    for (int j = 0; j < 32; ++j) b[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::lround(src[j] * inv)));
  }
}

float bf16_to_fp32(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

uint16_t fp32_to_fp16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  const uint32_t magnitude = bits & 0x7FFFFFFFu;
  if (magnitude >= 0x7F800000u) {  // inf stays inf; NaN stays a (quiet) NaN
    return sign | (magnitude > 0x7F800000u ? 0x7E00 : 0x7C00);
  }
  if (magnitude >= 0x477FF000u) return sign | 0x7C00;  // rounds to 65520 or more: inf
  if (magnitude < 0x38800000u) {
    // Below the smallest normal (2^-14): a subnormal, value = m * 2^-24, rounded to nearest even.
    float abs_value;
    std::memcpy(&abs_value, &magnitude, sizeof abs_value);
    return sign | static_cast<uint16_t>(std::nearbyint(abs_value * 0x1p24f));
  }
  // Normal: drop 13 mantissa bits with round to nearest even (a carry into the exponent is the right result).
  const uint32_t rebiased = magnitude - (uint32_t{112} << 23);
  const uint32_t rounded = rebiased + 0xFFFu + ((rebiased >> 13) & 1u);
  return sign | static_cast<uint16_t>(rounded >> 13);
}

uint16_t fp32_to_bf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);  // NaN: quiet
  return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);  // a carry rounds up the exponent
}

namespace {

// fp32_to_bf16 over a row, branch-free so that each level's clone vectorizes it: a 16-bit KV pool rounds every key
// and value a step writes (kernels/cpu/kv_rows.h).
STRATA_SIMD_CLONES void round_row_to_bf16(const float* src, uint8_t* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t bits = std::bit_cast<uint32_t>(src[i]);
    const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
    const uint32_t h = (bits & 0x7FFFFFFFu) > 0x7F800000u ? (bits >> 16) | 0x40u : rounded;
    out[2 * i] = static_cast<uint8_t>(h & 0xFF);
    out[2 * i + 1] = static_cast<uint8_t>(h >> 8);
  }
}

}  // namespace

void round_row_to_half(WeightFormat format, const float* src, void* dst, int64_t n) {
  if (format != WeightFormat::f16 && format != WeightFormat::bf16) {
    throw std::invalid_argument("round_row_to_half: " + std::string(weight_format_info(format).name) +
                                " is not a 16-bit float format");
  }
  auto* out = static_cast<uint8_t*>(dst);
  if (format == WeightFormat::bf16) return round_row_to_bf16(src, out, n);
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t h = fp32_to_fp16(src[i]);
    out[2 * i] = static_cast<uint8_t>(h & 0xFF);
    out[2 * i + 1] = static_cast<uint8_t>(h >> 8);
  }
}

void dequantize_k_quant_block(const uint8_t* block, const uint8_t* qs, const uint8_t* qh, float* y) {
  const float d = fp16_to_fp32(load_u16(block));
  const float dmin = fp16_to_fp32(load_u16(block + 2));
  const uint8_t* scales = block + 4;
  for (int c = 0; c < 4; ++c, qs += 32, y += 64) {
    int sc0, mn0, sc1, mn1;
    k_quant_scale_min(scales, 2 * c, sc0, mn0);
    k_quant_scale_min(scales, 2 * c + 1, sc1, mn1);
    const float d0 = d * static_cast<float>(sc0), m0 = dmin * static_cast<float>(mn0);
    const float d1 = d * static_cast<float>(sc1), m1 = dmin * static_cast<float>(mn1);
    for (int l = 0; l < 32; ++l) {
      int lo = qs[l] & 0xF, hi = qs[l] >> 4;
      if (qh != nullptr) {
        lo += ((qh[l] >> (2 * c)) & 1) << 4;
        hi += ((qh[l] >> (2 * c + 1)) & 1) << 4;
      }
      y[l] = d0 * static_cast<float>(lo) - m0;
      y[l + 32] = d1 * static_cast<float>(hi) - m1;
    }
  }
}

void five_bit_values(const uint8_t* qh_bytes, const uint8_t* qs, uint8_t* u) {
  const uint32_t qh = qh_bytes[0] | (qh_bytes[1] << 8) | (qh_bytes[2] << 16) |
                      (static_cast<uint32_t>(qh_bytes[3]) << 24);
  for (int j = 0; j < 16; ++j) {
    u[j] = static_cast<uint8_t>((qs[j] & 0xF) | (((qh >> j) & 1) << 4));
    u[j + 16] = static_cast<uint8_t>((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
  }
}

void k_quant_scale_min(const uint8_t* scales, int s, int& scale, int& min) {
  if (s < 4) {
    scale = scales[s] & 63;
    min = scales[s + 4] & 63;
  } else {
    scale = (scales[s + 4] & 0xF) | ((scales[s - 4] >> 6) << 4);
    min = (scales[s + 4] >> 4) | ((scales[s] >> 6) << 4);
  }
}

}  // namespace strata
