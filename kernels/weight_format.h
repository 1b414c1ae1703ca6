#pragma once
// The formats a weight matrix can be handed to a backend in: fp32, IEEE half or bfloat16, or one of the GGML block
// formats the CPU kernels compute with directly (../shared/specs/model_format.md, section 2, has every layout). A
// row is a contiguous run of whole blocks; y = the dequantized value:
//   f16, bf16  one value per 2 bytes (little-endian), y its fp32 value exactly
//   q8_0  32 per block, 34 bytes: f16 d, i8 q[32]                              y = d * q
//   q4_0  32 per block, 18 bytes: f16 d, u8 qs[16] (low nibbles first half)   y = d * (q - 8)
//   q4_1  32 per block, 20 bytes: f16 d, f16 m, u8 qs[16]                     y = d * q + m
//   q5_1  32 per block, 24 bytes: f16 d, f16 m, u32 qh (fifth bits), u8 qs[16]  y = d * q + m
//   q4_k  256 per block, 144 bytes: 8 sub-blocks of 32 with 6-bit scales and mins
//   q5_k  256 per block, 176 bytes: q4_k's scales and mins, and a fifth bit per value
//   q6_k  256 per block, 210 bytes: 16 sub-blocks of 16 with int8 scales, 6-bit values
#include <bit>
#include <cstdint>
#include <string_view>

namespace strata {

enum class WeightFormat : uint8_t { f32, q8_0, q4_0, q4_1, q4_k, q6_k, q5_k, q5_1, f16, bf16 };

struct WeightFormatInfo {
  std::string_view name;
  int64_t block_elements;
  int64_t block_bytes;
};

const WeightFormatInfo& weight_format_info(WeightFormat format);

// A row-major [rows, cols] weight matrix in host memory, in `format`. Linear weights are [out_features,
// in_features]: y[o] = dot(row o, x). The memory belongs to whoever made the view (the loader's buffers, a
// mapped file).
struct WeightMatrix {
  const void* data = nullptr;
  WeightFormat format = WeightFormat::f32;
  int64_t rows = 0;
  int64_t cols = 0;

  int64_t size() const { return rows * cols; }
  int64_t row_bytes() const;
  int64_t bytes() const { return rows * row_bytes(); }
  const uint8_t* row(int64_t r) const { return static_cast<const uint8_t*>(data) + r * row_bytes(); }
  // The values of an f32 matrix; std::logic_error for a block format.
  const float* f32() const;
};

// Dequantizes n values (a multiple of the format's block size) of one row.
void dequantize_weight_row(WeightFormat format, const void* src, float* dst, int64_t n);
// GGML's Q8_0 rounding of n values (a multiple of 32): d = max|x| / 127, q = round(x / d).
void quantize_row_q8_0(const float* src, void* dst, int64_t n);

// IEEE binary16 (subnormals, inf and NaN included) and bfloat16 bit patterns to fp32; fp32 to binary16 and
// bfloat16 below, rounding to nearest even. fp16_to_fp32 is inline: the portable kernels convert every block's
// scale with it.
inline float fp16_to_fp32(uint16_t h) {
  // Without branches, so that loops of conversions vectorise: the magnitude's bits moved to fp32's places read as
  // a float times 2^112 (fp32's exponent bias less fp16's, 127 - 15, as a power of two) is exact for normal and
  // subnormal halves alike; exponent 31 (inf, NaN with its payload) becomes fp32's 255 instead.
  const uint32_t moved = static_cast<uint32_t>(h & 0x7FFF) << 13;
  const uint32_t finite = std::bit_cast<uint32_t>(std::bit_cast<float>(moved) * 0x1p112f);
  const uint32_t magnitude = (h & 0x7C00) == 0x7C00 ? (moved | 0x7F800000u) : finite;
  return std::bit_cast<float>(magnitude | (static_cast<uint32_t>(h & 0x8000) << 16));
}
float bf16_to_fp32(uint16_t bits);
uint16_t fp32_to_fp16(float value);
// fp32 to bfloat16, rounding to nearest even (NaN stays a quiet NaN).
uint16_t fp32_to_bf16(float value);
// n fp32 values rounded to `format` (f16 or bf16), 2 bytes each, little-endian.
void round_row_to_half(WeightFormat format, const float* src, void* dst, int64_t n);

// The 32 five-bit values of a Q5_0 or Q5_1 block from its fifth bits (qh: 4 bytes, bit j for value j) and its
// nibbles (qs: value j < 16 in the low nibble of qs[j], value j + 16 in the high one).
void five_bit_values(const uint8_t* qh, const uint8_t* qs, uint8_t* u);
// A Q5_1 block's: its qh at byte 4 (after d and m), its qs at byte 8.
inline void q5_1_values(const uint8_t* block, uint8_t* u) { five_bit_values(block + 4, block + 8, u); }

// The 6-bit scale and min of sub-block s packed in the 12 scale bytes of a Q4_K (or Q5_K) block.
void k_quant_scale_min(const uint8_t* scales, int s, int& scale, int& min);
// The 256 values of a Q4_K block, or of a Q5_K block when qh is given: d, dmin and the packed scales at `block`, the
// nibbles at qs (4 chunks of 32 bytes: chunk c's low nibbles are sub-block 2c, its high ones 2c + 1), and Q5_K's
// fifth bits at qh (bits 2c and 2c + 1 of qh[l] for chunk c).
void dequantize_k_quant_block(const uint8_t* block, const uint8_t* qs, const uint8_t* qh, float* y);

}  // namespace strata
