#include "kernels/cpu/packed_weight.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace strata::cpu {
namespace {

uint16_t load_u16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
void store_u16(uint8_t* p, uint16_t v) {
  p[0] = uint8_t(v & 0xFF);
  p[1] = uint8_t(v >> 8);
}

// One 32-value block of a source format as its header (f16 d and m) and its 32 unsigned values.
struct UnsignedBlock {
  uint16_t d = 0, m = 0;
  uint8_t u[32] = {};
};

// The f16 offset m = -offset * d of a format with signed values (a power of two: exact unless it overflows).
uint16_t signed_offset(uint16_t d, float offset, const char* format) {
  const float m = -offset * fp16_to_fp32(d);
  const uint16_t bits = fp32_to_fp16(m);
  if (std::isinf(fp16_to_fp32(bits)) && std::isfinite(m)) {
    throw std::invalid_argument(std::string(format) + " block scale " + std::to_string(fp16_to_fp32(d)) +
                                " is too large to repack (its offset overflows f16)");
  }
  return bits;
}

UnsignedBlock unsigned_block(WeightFormat format, const uint8_t* b) {
  UnsignedBlock out;
  switch (format) {
    case WeightFormat::q4_0:
      out.d = load_u16(b);
      out.m = signed_offset(out.d, 8.0f, "q4_0");
      for (int j = 0; j < 16; ++j) out.u[j] = b[2 + j] & 0xF, out.u[j + 16] = b[2 + j] >> 4;
      break;
    case WeightFormat::q4_1:
      out.d = load_u16(b);
      out.m = load_u16(b + 2);
      for (int j = 0; j < 16; ++j) out.u[j] = b[4 + j] & 0xF, out.u[j + 16] = b[4 + j] >> 4;
      break;
    case WeightFormat::q8_0:
      out.d = load_u16(b);
      out.m = signed_offset(out.d, 128.0f, "q8_0");
      for (int j = 0; j < 32; ++j) out.u[j] = uint8_t(b[2 + j] ^ 0x80);  // q + 128
      break;
    case WeightFormat::q5_1:  // five bits held as eight: Q8_0's layouts, with the block's own offset
      out.d = load_u16(b);
      out.m = load_u16(b + 2);
      q5_1_values(b, out.u);
      break;
    default:
      throw std::logic_error("unsigned_block: not a 32-value format");
  }
  return out;
}

// One row of a 32-value format into the pair layout (u4 or u8).
void pack_pair_row(WeightFormat format, const uint8_t* src, int64_t cols, bool four_bit, uint8_t* dst) {
  const WeightFormatInfo& info = weight_format_info(format);
  const int64_t n_blocks = cols / 32;
  const int64_t group_bytes = four_bit ? kU4PairBytes : kU8PairBytes;
  for (int64_t g = 0; g < pair_groups(cols); ++g, dst += group_bytes) {
    UnsignedBlock b[2];
    for (int k = 0; k < 2; ++k) {
      if (2 * g + k < n_blocks) b[k] = unsigned_block(format, src + (2 * g + k) * info.block_bytes);
    }
    store_u16(dst, b[0].d);
    store_u16(dst + 2, b[1].d);
    store_u16(dst + 4, b[0].m);
    store_u16(dst + 6, b[1].m);
    uint8_t* payload = dst + 8;
    for (int j = 0; j < 32; ++j) {
      if (four_bit) {
        payload[j] = uint8_t(b[0].u[j] | (b[1].u[j] << 4));
      } else {
        payload[j] = b[0].u[j];
        payload[32 + j] = b[1].u[j];
      }
    }
  }
}

// Where value v (< 32) of row `lane` sits in a block of a 16-row tile: its byte, and its shift (4 for a u4 value
// in the high nibble). Values 4c .. 4c + 3 of the 16 rows make the 64-byte vector c, 4 bytes a row.
struct Rows16Place {
  int byte, shift;
};
Rows16Place rows16_place(int v, int lane, bool four_bit) {
  const int c = v / 4, k = v % 4;
  if (!four_bit) return {64 + 64 * c + 4 * lane + k, 0};
  return {64 + 64 * (c % 4) + 4 * lane + k, c < 4 ? 0 : 4};
}

// Rows [16t, 16t + 16) of a 32-value format into one 16-row tile (u4 or u8), whose bytes are zero.
void pack_rows16_tile(const WeightMatrix& w, int64_t t, bool four_bit, uint8_t* dst) {
  const WeightFormatInfo& info = weight_format_info(w.format);
  const int64_t block_bytes = four_bit ? kU4Rows16BlockBytes : kU8Rows16BlockBytes;
  for (int64_t b = 0; b < w.cols / 32; ++b, dst += block_bytes) {
    for (int lane = 0; lane < kTileRows16; ++lane) {
      const UnsignedBlock u = unsigned_block(w.format, w.row(kTileRows16 * t + lane) + b * info.block_bytes);
      store_u16(dst + 2 * lane, u.d);
      store_u16(dst + 32 + 2 * lane, u.m);
      for (int v = 0; v < 32; ++v) {
        const Rows16Place at = rows16_place(v, lane, four_bit);
        dst[at.byte] |= uint8_t(u.u[v] << at.shift);
      }
    }
  }
}

// Rows [16t, 16t + 16) of a Q4_K or Q5_K matrix into one k4_rows16 or k5_rows16 tile, whose bytes are zero.
void pack_k4_or_k5_rows16_tile(const WeightMatrix& w, int64_t t, uint8_t* dst) {
  const WeightFormatInfo& info = weight_format_info(w.format);
  const bool q5 = w.format == WeightFormat::q5_k;
  const int64_t super_bytes = q5 ? kK5Rows16SuperBytes : kK4Rows16SuperBytes;
  const int64_t sub_bytes = q5 ? kK5Rows16SubBytes : kK4Rows16SubBytes;
  for (int64_t sb = 0; sb < w.cols / 256; ++sb, dst += super_bytes) {
    for (int lane = 0; lane < kTileRows16; ++lane) {
      // d, dmin, scales, then Q4_K's nibbles, or Q5_K's fifth bits and nibbles
      const uint8_t* src = w.row(kTileRows16 * t + lane) + sb * info.block_bytes;
      const uint8_t* qs = src + (q5 ? 48 : 16);
      const uint8_t* qh = src + 16;  // Q5_K's fifth bits: bit s of qh[v] for value v of sub-block s
      store_u16(dst + 2 * lane, load_u16(src));
      store_u16(dst + 32 + 2 * lane, load_u16(src + 2));
      for (int s = 0; s < 8; ++s) {
        uint8_t* sub = dst + 64 + s * sub_bytes;
        int scale, min;
        k_quant_scale_min(src + 4, s, scale, min);
        sub[lane] = uint8_t(scale);
        sub[16 + lane] = uint8_t(min);
        const uint8_t* nibbles = qs + 32 * (s / 2);  // sub-block 2c: low nibbles of chunk c, 2c + 1: high
        for (int v = 0; v < 32; ++v) {
          const Rows16Place at = rows16_place(v, lane, true);
          sub[32 + at.byte - 64] |= uint8_t(((nibbles[v] >> (4 * (s % 2))) & 0xF) << at.shift);
          if (q5) sub[kK5Rows16FifthBits + 4 * lane + v % 4] |= uint8_t(((qh[v] >> s) & 1) << (v / 4));
        }
      }
    }
  }
}

// Value n (< 256) of a Q6_K block: its 6-bit unsigned value and the index of its int8 scale.
void q6_k_value(const uint8_t* block, int n, uint8_t& u, int& scale_index) {
  const int half = n / 128, quarter = n % 128 / 32, l = n % 32;
  const uint8_t low = block[64 * half + l + 32 * (quarter % 2)];  // ql
  const uint8_t high = block[128 + 32 * half + l];                // qh
  u = uint8_t((quarter < 2 ? low & 0xF : low >> 4) | ((high >> (2 * quarter)) & 3) << 4);
  scale_index = 8 * half + l / 16 + 2 * quarter;
}

// Rows [16t, 16t + 16) of a Q6_K matrix into one k6_rows16 tile, whose bytes are zero.
void pack_k6_rows16_tile(const WeightMatrix& w, int64_t t, uint8_t* dst) {
  const WeightFormatInfo& info = weight_format_info(w.format);
  for (int64_t sb = 0; sb < w.cols / 256; ++sb, dst += kK6Rows16SuperBytes) {
    for (int lane = 0; lane < kTileRows16; ++lane) {
      const uint8_t* src = w.row(kTileRows16 * t + lane) + sb * info.block_bytes;  // ql, qh, scales, d
      store_u16(dst + 2 * lane, load_u16(src + 208));
      for (int j = 0; j < 8; ++j) {
        uint8_t* sub = dst + 32 + j * kK6Rows16SubBytes;
        for (int v = 0; v < 32; ++v) {
          uint8_t u;
          int scale_index;
          q6_k_value(src, 32 * j + v, u, scale_index);
          sub[16 * (v / 16) + lane] = src[192 + scale_index];
          const Rows16Place at = rows16_place(v, lane, true);
          sub[32 + at.byte - 64] |= uint8_t((u & 0xF) << at.shift);
          sub[kK6Rows16HighBits + 64 * (v / 16) + 4 * lane + v % 4] |= uint8_t((u >> 4) << (2 * (v / 4 % 4)));
        }
      }
    }
  }
}

void dequantize_pair_row(const uint8_t* src, int64_t cols, bool four_bit, float* out) {
  const int64_t group_bytes = four_bit ? kU4PairBytes : kU8PairBytes;
  for (int64_t g = 0; g < pair_groups(cols); ++g, src += group_bytes) {
    for (int k = 0; k < 2 && 64 * g + 32 * k < cols; ++k) {
      const float d = fp16_to_fp32(load_u16(src + 2 * k)), m = fp16_to_fp32(load_u16(src + 4 + 2 * k));
      float* y = out + 64 * g + 32 * k;
      for (int j = 0; j < 32; ++j) {
        const int u = four_bit ? (src[8 + j] >> (4 * k)) & 0xF : src[8 + 32 * k + j];
        y[j] = d * float(u) + m;
      }
    }
  }
}

// Rows [first, first + n) of one 16-row tile of w (first + n <= 16) as fp32, into out [n][cols].
void dequantize_rows16(const PackedWeight& w, int64_t tile, int first, int n, float* out) {
  for (int64_t b = 0; b < w.cols / 32; ++b) {
    for (int r = 0; r < n; ++r) {
      const Rows16Block block = rows16_block_values(w, tile, b, first + r);
      float* y = out + r * w.cols + 32 * b;
      for (int v = 0; v < 32; ++v) y[v] = block.d[v / 16] * float(block.u[v] - block.zero) + block.m[v / 16];
    }
  }
}

struct PackedShape {
  PackedLayout layout;
  int64_t row_bytes;
};

// The layout pack_weight gives w, and its bytes per row.
PackedShape packed_shape(const WeightMatrix& w, PairPacking packing) {
  switch (w.format) {
    case WeightFormat::f32: return {PackedLayout::f32, w.row_bytes()};
    case WeightFormat::f16: return {PackedLayout::f16, w.row_bytes()};
    case WeightFormat::bf16: return {PackedLayout::bf16, w.row_bytes()};
    case WeightFormat::q4_k:
      if (packing == PairPacking::rows16 && w.rows % kTileRows16 == 0) {
        return {PackedLayout::k4_rows16, w.cols / 256 * kK4Rows16SuperBytes / kTileRows16};
      }
      return {PackedLayout::q4_k, w.row_bytes()};
    case WeightFormat::q5_k:
      if (packing == PairPacking::rows16 && w.rows % kTileRows16 == 0) {
        return {PackedLayout::k5_rows16, w.cols / 256 * kK5Rows16SuperBytes / kTileRows16};
      }
      return {PackedLayout::q5_k, w.row_bytes()};
    case WeightFormat::q6_k:
      if (packing == PairPacking::rows16 && w.rows % kTileRows16 == 0) {
        return {PackedLayout::k6_rows16, w.cols / 256 * kK6Rows16SuperBytes / kTileRows16};
      }
      return {PackedLayout::q6_k, w.row_bytes()};
    case WeightFormat::q4_0:
    case WeightFormat::q4_1:
    case WeightFormat::q8_0:
    case WeightFormat::q5_1: break;
  }
  const bool four_bit = !held_as_u8(w.format);
  if (packing == PairPacking::rows16 && w.rows % kTileRows16 == 0) {
    return {four_bit ? PackedLayout::u4_rows16 : PackedLayout::u8_rows16,
            w.cols / 32 * (four_bit ? kU4Rows16BlockBytes : kU8Rows16BlockBytes) / kTileRows16};
  }
  return {four_bit ? PackedLayout::u4_pairs : PackedLayout::u8_pairs,
          pair_groups(w.cols) * (four_bit ? kU4PairBytes : kU8PairBytes)};
}

}  // namespace

int64_t pair_groups(int64_t cols) { return (cols / 32 + 1) / 2; }

bool is_rows16(PackedLayout layout) {
  return layout == PackedLayout::u4_rows16 || layout == PackedLayout::u8_rows16 ||
         layout == PackedLayout::k4_rows16 || layout == PackedLayout::k5_rows16 || layout == PackedLayout::k6_rows16;
}

Rows16Block rows16_block_values(const PackedWeight& w, int64_t tile, int64_t b, int lane) {
  Rows16Block out{};
  const uint8_t* first = w.data + tile * kTileRows16 * w.row_bytes;
  const bool four_bit = w.layout != PackedLayout::u8_rows16;
  const uint8_t* values;           // where rows16_place's byte 64 is
  const uint8_t* high = nullptr;   // k6_rows16: the high 2 bits
  const uint8_t* fifth = nullptr;  // k5_rows16: the fifth bits
  if (w.layout == PackedLayout::k6_rows16) {
    const uint8_t* super = first + b / 8 * kK6Rows16SuperBytes;
    const uint8_t* sub = super + 32 + b % 8 * kK6Rows16SubBytes;
    const float d = fp16_to_fp32(load_u16(super + 2 * lane));
    for (int h = 0; h < 2; ++h) out.d[h] = d * float(int8_t(sub[16 * h + lane]));
    out.zero = 32;
    values = sub + 32 - 64;
    high = sub + kK6Rows16HighBits;
  } else if (w.layout == PackedLayout::k4_rows16 || w.layout == PackedLayout::k5_rows16) {
    const bool k5 = w.layout == PackedLayout::k5_rows16;
    const uint8_t* super = first + b / 8 * (k5 ? kK5Rows16SuperBytes : kK4Rows16SuperBytes);
    const uint8_t* sub = super + 64 + b % 8 * (k5 ? kK5Rows16SubBytes : kK4Rows16SubBytes);
    out.d[0] = out.d[1] = fp16_to_fp32(load_u16(super + 2 * lane)) * float(sub[lane]);
    out.m[0] = out.m[1] = -(fp16_to_fp32(load_u16(super + 32 + 2 * lane)) * float(sub[16 + lane]));
    values = sub + 32 - 64;
    if (k5) fifth = sub + kK5Rows16FifthBits;
  } else {
    const uint8_t* block = first + b * (four_bit ? kU4Rows16BlockBytes : kU8Rows16BlockBytes);
    out.d[0] = out.d[1] = fp16_to_fp32(load_u16(block + 2 * lane));
    out.m[0] = out.m[1] = fp16_to_fp32(load_u16(block + 32 + 2 * lane));
    values = block;
  }
  for (int v = 0; v < 32; ++v) {
    const Rows16Place at = rows16_place(v, lane, four_bit);
    out.u[v] = uint8_t(values[at.byte] >> at.shift & (four_bit ? 0xF : 0xFF));
  }
  if (high) {
    for (int v = 0; v < 32; ++v) {
      out.u[v] |= uint8_t((high[64 * (v / 16) + 4 * lane + v % 4] >> (2 * (v / 4 % 4)) & 3) << 4);
    }
  }
  if (fifth) {
    for (int v = 0; v < 32; ++v) out.u[v] |= uint8_t((fifth[4 * lane + v % 4] >> (v / 4) & 1) << 4);
  }
  return out;
}

namespace {

// Zeroed bytes for a matrix's packed values: from the arena when there is one, else owned by `out`.
uint8_t* packed_storage(size_t bytes, HostArena* arena, OwnedPackedWeight& out) {
  if (arena) return arena->allocate(bytes);
  out.storage = std::make_unique<uint8_t[]>(bytes);
  return out.storage.get();
}

}  // namespace

OwnedPackedWeight pack_weight(const WeightMatrix& w, PairPacking packing, HostArena* arena) {
  OwnedPackedWeight out;
  PackedWeight& p = out.view;
  p.rows = w.rows;
  p.cols = w.cols;
  const PackedShape shape = packed_shape(w, packing);
  p.layout = shape.layout;
  p.row_bytes = shape.row_bytes;
  p.data = static_cast<const uint8_t*>(w.data);
  const bool four_bit = p.layout == PackedLayout::u4_pairs || p.layout == PackedLayout::u4_rows16;
  if (is_rows16(p.layout)) {
    uint8_t* tiles = packed_storage(size_t(p.rows * p.row_bytes), arena, out);  // zeroed: u4 tiles are or-ed in
    for (int64_t t = 0; t < w.rows / kTileRows16; ++t) {
      uint8_t* tile = tiles + t * kTileRows16 * p.row_bytes;
      if (p.layout == PackedLayout::k4_rows16 || p.layout == PackedLayout::k5_rows16) {
        pack_k4_or_k5_rows16_tile(w, t, tile);
      } else if (p.layout == PackedLayout::k6_rows16) {
        pack_k6_rows16_tile(w, t, tile);
      } else {
        pack_rows16_tile(w, t, four_bit, tile);
      }
    }
    p.data = tiles;
  } else if (p.layout == PackedLayout::u4_pairs || p.layout == PackedLayout::u8_pairs) {
    // 64 bytes of slack (zeroed): the kernels may load a full vector from a row's last group.
    uint8_t* pairs = packed_storage(size_t(p.rows * p.row_bytes + 64), arena, out);
    for (int64_t r = 0; r < w.rows; ++r) pack_pair_row(w.format, w.row(r), w.cols, four_bit, pairs + r * p.row_bytes);
    p.data = pairs;
  }
  return out;
}

int64_t packed_weight_bytes(const WeightMatrix& w, PairPacking packing) {
  return w.rows * packed_shape(w, packing).row_bytes;
}

void dequantize_rows(const PackedWeight& w, int64_t row_begin, int64_t n_rows, float* out) {
  if (is_rows16(w.layout)) {
    for (int64_t i = row_begin; i < row_begin + n_rows;) {  // the rows in each tile they touch
      const int first = int(i % kTileRows16);
      const int n = int(std::min<int64_t>(kTileRows16 - first, row_begin + n_rows - i));
      dequantize_rows16(w, i / kTileRows16, first, n, out + (i - row_begin) * w.cols);
      i += n;
    }
    return;
  }
  for (int64_t r = 0; r < n_rows; ++r) {
    const uint8_t* src = w.data + (row_begin + r) * w.row_bytes;
    float* y = out + r * w.cols;
    switch (w.layout) {
      case PackedLayout::f32: std::memcpy(y, src, size_t(w.cols) * sizeof(float)); break;
      case PackedLayout::u4_pairs: dequantize_pair_row(src, w.cols, true, y); break;
      case PackedLayout::u8_pairs: dequantize_pair_row(src, w.cols, false, y); break;
      case PackedLayout::u4_rows16:
      case PackedLayout::u8_rows16:
      case PackedLayout::k4_rows16:
      case PackedLayout::k5_rows16:
      case PackedLayout::k6_rows16: break;  // above
      case PackedLayout::q4_k: dequantize_weight_row(WeightFormat::q4_k, src, y, w.cols); break;
      case PackedLayout::q5_k: dequantize_weight_row(WeightFormat::q5_k, src, y, w.cols); break;
      case PackedLayout::q6_k: dequantize_weight_row(WeightFormat::q6_k, src, y, w.cols); break;
      case PackedLayout::f16: dequantize_weight_row(WeightFormat::f16, src, y, w.cols); break;
      case PackedLayout::bf16: dequantize_weight_row(WeightFormat::bf16, src, y, w.cols); break;
    }
  }
}

}  // namespace strata::cpu
