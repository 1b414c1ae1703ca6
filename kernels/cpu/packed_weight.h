#pragma once
// How the CPU backend holds a weight matrix (Backend::upload_weight). Every quantized format is computed on as
// unsigned integers u with a scale d and an offset m per group of values, y = d * u + m:
//   q4_0, q4_1 -> u4_pairs: repacked. Per row, groups of 64 values (two 32-value blocks; an odd last block is paired
//                 with zeros): f16 d0, d1, m0, m1 (8 bytes), then 32 bytes whose byte j holds value j in its low
//                 nibble and value 32 + j in its high nibble. A 256-bit load spread over 512 bits and shifted by 0
//                 or 4 gives the 64 values in order. Q4_0's m is -8d, exact in f16. 40 bytes per 64 values.
//   q8_0       -> u8_pairs: repacked. Groups of 64 values: f16 d0, d1, m0 = -128 d0, m1 = -128 d1, then u = q + 128
//                 as 64 bytes (72 bytes per 64 values).
//   q4_k       -> q4_k: the file's blocks as they are. Each 32 bytes of nibbles are already a u4 group of 64
//                 (sub-blocks 2c, 2c + 1); d = d_super * scale, m = -dmin * min per sub-block of 32.
//   q6_k       -> q6_k: the file's blocks as they are; y = d_super * scale * (u - 32) per sub-block of 16.
//   f32        -> f32: the caller's floats as they are (BLAS).
// The repacked layouts cost no more memory than the file's blocks (Q4_1, Q8_0) or 11% more (Q4_0), and save the
// kernels the scattered loads of interleaved headers.
#include <cstdint>
#include <memory>

#include "kernels/weight_format.h"

namespace strata::cpu {

enum class PackedLayout : uint8_t { f32, u4_pairs, u8_pairs, q4_k, q6_k };

// A plain view: the kernels' translation units compiled for other instruction sets see no inline code here.
struct PackedWeight {
  PackedLayout layout = PackedLayout::f32;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t row_bytes = 0;       // distance between two rows in `data`
  const uint8_t* data = nullptr;
};

// Bytes of one header + payload group of the pair layouts.
constexpr int64_t kU4PairBytes = 8 + 32;
constexpr int64_t kU8PairBytes = 8 + 64;

// A packed matrix with the memory its repacked layouts need (none for the layouts used in place).
struct OwnedPackedWeight {
  PackedWeight view;
  std::unique_ptr<uint8_t[]> storage;
};

// Packs `w` (whose memory must outlive the result for the in-place layouts). std::invalid_argument for a Q4_0 or
// Q8_0 scale whose offset (-8d, -128d) overflows f16.
OwnedPackedWeight pack_weight(const WeightMatrix& w);

// Groups of 64 values per row of the pair layouts (the 32-value blocks, rounded up to an even count).
int64_t pair_groups(int64_t cols);

// Rows [row_begin, row_begin + n_rows) of `w` as fp32, into out [n_rows, cols].
void dequantize_rows(const PackedWeight& w, int64_t row_begin, int64_t n_rows, float* out);

}  // namespace strata::cpu
