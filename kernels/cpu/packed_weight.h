#pragma once
// How the CPU backend holds a weight matrix (Backend::upload_weight). Every quantized format is computed on as
// unsigned integers u with a scale d and an offset m per group of values, y = d * u + m:
//   q4_0, q4_1 -> u4_pairs: repacked. Per row, groups of 64 values (two 32-value blocks; an odd last block is paired
//                 with zeros): f16 d0, d1, m0, m1 (8 bytes), then 32 bytes whose byte j holds value j in its low
//                 nibble and value 32 + j in its high nibble. A 256-bit load spread over 512 bits and shifted by 0
//                 or 4 gives the 64 values in order. Q4_0's m is -8d, exact in f16. 40 bytes per 64 values.
//   q8_0       -> u8_pairs: repacked. Groups of 64 values: f16 d0, d1, m0 = -128 d0, m1 = -128 d1, then u = q + 128
//                 as 64 bytes (72 bytes per 64 values).
//   q5_1       -> u8_pairs: likewise, with each block's own d and m and u its five-bit value (72 bytes per 64
//                 values against the file's 48: no u5 layout, and exact, where f32 took 256).
//   q4_0, q4_1 -> u4_rows16, q8_0 and q5_1 -> u8_rows16: instead of the pairs, where pack_weight is asked for row
//                 tiles (int8 activations on an AVX-512 VNNI machine) and the rows are a multiple of 16: tiles of 16
//                 rows, and in a tile, per block of 32 values, the 16 rows' f16 d (32 bytes), their f16 m (32
//                 bytes), then the values 4 at a time across the rows: byte 4 * row + k of 64-byte vector c holds
//                 value 4c + k of that row (u8: c < 8; u4: c < 4, value 16 + 4c + k in the high nibble). One
//                 vpdpbusd then multiplies 4 values of 16 rows with 4 activation bytes broadcast, each lane summing
//                 its own row (kernels/cpu/quantized_dot_avx512_vnni.cpp). 20 (u4) or 36 (u8) bytes per row and
//                 block, as the pairs.
//   q4_k       -> q4_k: the file's blocks as they are. Each 32 bytes of nibbles are already a u4 group of 64
//                 (sub-blocks 2c, 2c + 1); d = d_super * scale, m = -dmin * min per sub-block of 32.
//   q4_k       -> k4_rows16: instead, where pack_weight is asked for row tiles and the rows are a multiple of 16:
//                 tiles of 16 rows, and in a tile, per super-block of 256 values, the 16 rows' f16 d_super (32
//                 bytes) and dmin (32 bytes), then its 8 sub-blocks of 32 values, each the 16 rows' 6-bit scales
//                 and mins as bytes (32 bytes) and the values as a u4_rows16 block holds them (256 bytes); so
//                 d = d_super * scale and m = -(dmin * min), computed in fp32 as the format's own dequantization
//                 does. The same vpdpbusd loop as u4_rows16 multiplies them. 148 bytes per row and super-block,
//                 the file's 144 and the unpacked scales (2.8% more).
//   q5_k       -> q5_k: the file's blocks as they are; q4_k's with a fifth bit per value (u < 32).
//   q5_k       -> k5_rows16: instead, where pack_weight is asked for row tiles and the rows are a multiple of 16:
//                 k4_rows16's tiles with, after each sub-block's values, their fifth bits (64 bytes: value 4c + k of
//                 row r at bit c of byte 4r + k, so that one vector holds the bits of all 8 code vectors); 180
//                 bytes per row and super-block, the file's 176 and the unpacked scales.
//   q6_k       -> q6_k: the file's blocks as they are; y = d_super * scale * (u - 32) per sub-block of 16.
//   q6_k       -> k6_rows16: instead, where pack_weight is asked for row tiles and the rows are a multiple of 16:
//                 tiles of 16 rows, and in a tile, per super-block of 256 values, the 16 rows' f16 d_super (32
//                 bytes), then its 8 blocks of 32 values, each the 16 rows' int8 scales of its two halves (32
//                 bytes: row r's first half at byte r, its second at 16 + r), the values' low 4 bits as a
//                 u4_rows16 block holds them (256 bytes), and their high 2 bits (128 bytes: value 4c + k of row r,
//                 c < 8, at bits 2 (c % 4) of byte 4r + k of 64-byte vector c / 4). So y = d_super * scale *
//                 (u - 32), u = low | high << 4; 210 bytes per row and super-block, the file's.
//   f16, bf16  -> f16, bf16: the file's values as they are, widened to fp32 in registers by the fused kernels (half
//                 the bytes of fp32 for a decode step to read) and in the fp32 tiles for prefill.
//   f32        -> f32: the caller's floats as they are (BLAS).
// The repacked layouts cost no more memory than the file's blocks (Q4_1, Q8_0) or 11% more (Q4_0), and save the
// kernels the scattered loads of interleaved headers.
#include <cstdint>
#include <memory>

#include "kernels/cpu/host_memory.h"
#include "kernels/weight_format.h"

namespace strata::cpu {

// The formats held as 8-bit values (u8_pairs, u8_rows16); the other 32-value ones as 4-bit.
inline bool held_as_u8(WeightFormat format) { return format == WeightFormat::q8_0 || format == WeightFormat::q5_1; }

enum class PackedLayout : uint8_t {
  f32, u4_pairs, u8_pairs, u4_rows16, u8_rows16, k4_rows16, k5_rows16, k6_rows16, q4_k, q5_k, q6_k, f16, bf16
};

// A plain view: the kernels' translation units compiled for other instruction sets see no inline code here.
struct PackedWeight {
  PackedLayout layout = PackedLayout::f32;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t row_bytes = 0;       // distance between two rows in `data` (rows16: a sixteenth of a tile's)
  const uint8_t* data = nullptr;
};

// Bytes of one header + payload group of the pair layouts.
constexpr int64_t kU4PairBytes = 8 + 32;
constexpr int64_t kU8PairBytes = 8 + 64;
// Bytes of one block of 32 values of a 16-row tile: 16 d and 16 m, then the values.
constexpr int64_t kTileRows16 = 16;
constexpr int64_t kU4Rows16BlockBytes = 64 + 256;
constexpr int64_t kU8Rows16BlockBytes = 64 + 512;
// Of k4_rows16: one sub-block of 32 values (16 scales, 16 mins, the values), one super-block (16 d_super, 16 dmin,
// 8 sub-blocks).
constexpr int64_t kK4Rows16SubBytes = 32 + 256;
constexpr int64_t kK4Rows16SuperBytes = 64 + 8 * kK4Rows16SubBytes;
// Of k5_rows16: k4_rows16's with each sub-block's fifth bits after its values.
constexpr int64_t kK5Rows16SubBytes = kK4Rows16SubBytes + 64;
constexpr int64_t kK5Rows16FifthBits = kK4Rows16SubBytes;  // where a sub-block's fifth bits start
constexpr int64_t kK5Rows16SuperBytes = 64 + 8 * kK5Rows16SubBytes;
// Of k6_rows16: one block of 32 values (32 scales, the low bits, the high bits), one super-block (16 d_super, 8
// blocks).
constexpr int64_t kK6Rows16SubBytes = 32 + 256 + 128;
constexpr int64_t kK6Rows16HighBits = 32 + 256;  // where a block's high bits start
constexpr int64_t kK6Rows16SuperBytes = 32 + 8 * kK6Rows16SubBytes;

bool is_rows16(PackedLayout layout);
// The 16-bit float layouts, which multiply fp32 activations whatever engine.activation_dtype says (as f32 weights
// do): they have no integer kernel, and rounding x would only lose what their values keep.
inline bool is_half(PackedLayout layout) { return layout == PackedLayout::f16 || layout == PackedLayout::bf16; }

// A packed matrix with the memory its repacked layouts need (none for the layouts used in place, or when an
// arena holds it).
struct OwnedPackedWeight {
  PackedWeight view;
  std::unique_ptr<uint8_t[]> storage;
};

// Which layout the 32-value formats and the k-quants take: pairs (the k-quants: their own blocks) for the fp32
// kernels, 16-row tiles for the int8 VNNI kernel.
enum class PairPacking : uint8_t { pairs, rows16 };

// Packs `w` (whose memory must outlive the result for the in-place layouts); with PairPacking::rows16 a 32-value
// format or k-quant whose rows are a multiple of 16 takes the 16-row tiles. std::invalid_argument for a Q4_0 or Q8_0 scale
// whose offset (-8d, -128d) overflows f16. With an arena, repacked values go there (the backend's, in huge pages:
// kernels/cpu/host_memory.h) and live as long as it does.
OwnedPackedWeight pack_weight(const WeightMatrix& w, PairPacking packing = PairPacking::pairs,
                              HostArena* arena = nullptr);

// The bytes of w's values as pack_weight(w, packing) holds them (the file's bytes for the layouts used in place).
int64_t packed_weight_bytes(const WeightMatrix& w, PairPacking packing);

// Groups of 64 values per row of the pair layouts (the 32-value blocks, rounded up to an even count).
int64_t pair_groups(int64_t cols);

// Rows [row_begin, row_begin + n_rows) of `w` as fp32, into out [n_rows, cols].
void dequantize_rows(const PackedWeight& w, int64_t row_begin, int64_t n_rows, float* out);

// Block b (of 32 values) of row `lane` (< 16) of 16-row tile `tile` of a rows16 layout: its unsigned values, and
// y = d[h] * (u - zero) + m[h] for the values of half h (16 each; the halves differ in Q6_K's only).
struct Rows16Block {
  uint8_t u[32];
  float d[2], m[2];
  int zero;
};
Rows16Block rows16_block_values(const PackedWeight& w, int64_t tile, int64_t b, int lane);

}  // namespace strata::cpu
