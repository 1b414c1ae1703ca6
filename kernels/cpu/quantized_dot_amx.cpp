// The integer kernel with AMX tiles (Intel from Sapphire Rapids, where kernels/cpu/amx_probe.h finds them usable)
// on the 16-row tiles of the formats with one scale per block of 32 values (u4_rows16, u8_rows16, k4_rows16,
// k5_rows16: kernels/cpu/packed_weight.h), for prefill chunks and batched decode; fewer rows of x, k6_rows16 and
// the pair layouts go to the AVX-512 VNNI kernel.
//
// One tile product (TDPBSUD) multiplies up to 16 activation rows with a block of 16 weight rows: A holds the
// rows' 32 int8 digits of the block as they lie in IntegerActivations (a row of the tile per activation row), B the
// block's codes as 8 rows of 64 bytes, 4 values of each of the 16 weight rows a row, which is the order
// rows16_block_codes gives (the tiles' own for u8; the nibbles unpacked for u4), and C their 16 x 16 sums in 32
// bits, exact. A block's scales differ per weight row and per activation row, so each block's C is stored and its
// sums converted and scaled in fp32 as the VNNI kernel does, in the same order: acc[r] += d_w * d_r (u . q_r)
// block after block, then offsets m_w * s_r summed block after block, and acc + offsets. So the two kernels give
// the same floats (tests/kernels/quantized_matmul_test.cpp). With two digits (int16 activations) each digit takes
// its tile product and u . q = 256 (u . q_high) + (u . q_low).
//
// Each 16-row weight tile's blocks are made once (codes, d and m) into a buffer that every 16 activation rows
// read, where the VNNI kernel redoes them for every 4 rows: a pass of kBlocksPerPass blocks of a group of weight
// tiles at a time (amx_tiles).
#include "kernels/cpu/integer_activations.h"
#include "kernels/cpu/quantized_dot.h"
#include "kernels/cpu/weight_prefetch.h"

#if STRATA_QUANTIZED_DOT_X86
#include <immintrin.h>

#include <algorithm>
#include <vector>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,f16c,fma,amx-tile,amx-int8")
// GCC 12 takes the self-initialised _mm512_undefined_* inside its own intrinsics for uninitialised reads.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace strata::cpu {
namespace {

#include "kernels/cpu/rows16_blocks_avx512.inc"

// One block of a 16-row weight tile as the tile products read it: its codes as an AMX B tile (8 rows of 64 bytes)
// and the 16 rows' d and m.
struct StagedBlock {
  alignas(64) uint8_t codes[8 * 64];
  float d[16];
  float m[16];
};
// The made blocks of a group of weight tiles in one pass: they stay in L2 while every activation tile reads them.
constexpr int64_t kStagedBytes = 256 * 1024;

// The eight tiles, each kind twice so that a product need not wait for the last one to free its operands: A,
// 16 activation rows' 32 digits of a block (tiles 0 and 1, in turn per product); B, a block's codes (2 and 3, in
// turn per block); C, the sums (4 to 7, in turn per product). A product is one digit of one block: with two digits
// a block's high digits go to A 0 and C 4 or 6, its low digits to A 1 and C 5 or 7. The tile intrinsics below
// take literal numbers: GCC's paste their tile operand into the instruction's text.
constexpr int kATiles[] = {0, 1}, kBTiles[] = {2, 3}, kCTiles[] = {4, 5, 6, 7};

// The 64-byte tile configuration (palette 1) for `rows` activation rows.
void configure_tiles(int rows) {
  struct alignas(64) Config {
    uint8_t palette = 1, start_row = 0, reserved[14] = {};
    uint16_t bytes_per_row[16] = {};
    uint8_t rows[16] = {};
  } config;
  for (int t : kATiles) {
    config.bytes_per_row[t] = 32;
    config.rows[t] = uint8_t(rows);
  }
  for (int t : kBTiles) {
    config.bytes_per_row[t] = 64;
    config.rows[t] = 8;
  }
  for (int t : kCTiles) {
    config.bytes_per_row[t] = 64;
    config.rows[t] = uint8_t(rows);
  }
  _tile_loadconfig(&config);
}

// Blocks [k0, k1) of tiles [t_begin, t_end) of w, made into `staged` (k1 - k0 blocks a tile).
template <PackedLayout Layout>
void stage_tiles(const PackedWeight& w, int64_t t_begin, int64_t t_end, int64_t k0, int64_t k1, StagedBlock* staged) {
  for (int64_t t = t_begin; t < t_end; ++t) {
    StagedBlock* blocks = staged + (t - t_begin) * (k1 - k0) - k0;
    const auto stage = [&](const __m512i (&codes)[8], __m512 d, __m512 m, int64_t b) {
      for (int c = 0; c < 8; ++c) _mm512_store_si512(blocks[b].codes + 64 * c, codes[c]);
      _mm512_storeu_ps(blocks[b].d, d);
      _mm512_storeu_ps(blocks[b].m, m);
    };
    for_each_rows16_block<Layout>(w.data + t * kTileRows16 * w.row_bytes, k0, k1, WeightPrefetch::near,
                                  stage);
  }
}

// Product `Step` (of 4 in turn): C tile 4 + Step = A tile Step % 2, loaded with the digits at `a` (rows `stride`
// bytes apart), times the codes in B tile 2 + B; then, apart, C tile 4 + Step stored to `sums` (16 x 16 int32).
#define STRATA_AMX_PRODUCT(a_tile, b_tile, c_tile) \
  _tile_zero(c_tile);                              \
  _tile_loadd(a_tile, a, stride);                  \
  _tile_dpbsud(c_tile, a_tile, b_tile);
template <int Step, int B>
inline void product(const int8_t* a, int64_t stride) {
  static_assert(Step >= 0 && Step < 4 && (B == 0 || B == 1));
  if constexpr (Step == 0 && B == 0) { STRATA_AMX_PRODUCT(0, 2, 4) }
  if constexpr (Step == 0 && B == 1) { STRATA_AMX_PRODUCT(0, 3, 4) }
  if constexpr (Step == 1 && B == 0) { STRATA_AMX_PRODUCT(1, 2, 5) }
  if constexpr (Step == 1 && B == 1) { STRATA_AMX_PRODUCT(1, 3, 5) }
  if constexpr (Step == 2 && B == 0) { STRATA_AMX_PRODUCT(0, 2, 6) }
  if constexpr (Step == 2 && B == 1) { STRATA_AMX_PRODUCT(0, 3, 6) }
  if constexpr (Step == 3 && B == 0) { STRATA_AMX_PRODUCT(1, 2, 7) }
  if constexpr (Step == 3 && B == 1) { STRATA_AMX_PRODUCT(1, 3, 7) }
}
#undef STRATA_AMX_PRODUCT
template <int Step>
inline void store_sums(int32_t (*sums)[16]) {
  if constexpr (Step == 0) _tile_stored(4, sums, 64);
  if constexpr (Step == 1) _tile_stored(5, sums, 64);
  if constexpr (Step == 2) _tile_stored(6, sums, 64);
  if constexpr (Step == 3) _tile_stored(7, sums, 64);
}

// An activation tile over blocks [k0, k1): up to 16 rows of x from a0, their digits from block k0 where
// IntegerActivations holds them, and each block's scales laid out by block (d[16 (b - k0) + r], likewise s), so that
// the loops over the rows read them at fixed offsets; rows beyond the tile's are zeros.
struct ActivationTile {
  const int8_t* q = nullptr;
  const int8_t* q_low = nullptr;
  int64_t stride = 0;
  std::vector<float> d, s;
};

void gather_activation_tile(const IntegerActivations& x, int64_t a0, int rows, int64_t k0, int64_t k1,
                            ActivationTile& tile) {
  tile.q = x.row_values(a0) + 32 * k0;
  tile.q_low = x.digits == 2 ? x.row_low_values(a0) + 32 * k0 : nullptr;
  tile.stride = x.groups * 64;
  tile.d.assign(size_t(16 * (k1 - k0)), 0.0f);
  tile.s.assign(size_t(16 * (k1 - k0)), 0.0f);
  for (int r = 0; r < rows; ++r) {
    const float* scales = x.row_scales(a0 + r);  // per pair of blocks: d0, d1, s0, s1
    for (int64_t b = k0; b < k1; ++b) {
      tile.d[size_t(16 * (b - k0) + r)] = scales[4 * (b / 2) + b % 2];
      tile.s[size_t(16 * (b - k0) + r)] = scales[4 * (b / 2) + 2 + b % 2];
    }
  }
}

// Blocks whose products are stored before any is read: a tile store reaches the vector loads that read it back
// only once it has retired, so each block's sums read right after its products stalled the loop.
constexpr int64_t kBlocksAtOnce = 8;
// Blocks of a pass (2,048 values): the weight tiles are made and multiplied a pass at a time, so that the
// activations' digits of a pass (32 or 64 KiB an activation tile, 512 KiB for 128 rows) stay in L2 while several
// weight tiles read them. Whole rows of Llama-3-8B's ffn_down (14,336 values: 3.5 MiB of digits at 128 rows) were
// read again for every weight tile, and the kernel was no faster than the VNNI one there.
constexpr int64_t kBlocksPerPass = 64;

// Calls f.template operator()<Step, B>(digit) for each product of block b, one per digit: with two digits steps 0
// and 1 (even b) or 2 and 3, with one step b % 4; its codes in B tile b % 2. Issuing and storing read it alike.
template <int Digits, class F>
inline void for_each_product(int64_t b, F&& f) {
  if constexpr (Digits == 2) {
    if (b % 2 == 0) {
      f.template operator()<0, 0>(0);
      f.template operator()<1, 0>(1);
    } else {
      f.template operator()<2, 1>(0);
      f.template operator()<3, 1>(1);
    }
  } else {
    switch (b % 4) {
      case 0: f.template operator()<0, 0>(0); break;
      case 1: f.template operator()<1, 1>(0); break;
      case 2: f.template operator()<2, 0>(0); break;
      default: f.template operator()<3, 1>(0); break;
    }
  }
}

// Block b's codes into its B tile and its products issued.
template <int Digits>
inline void issue_block(const StagedBlock& block, int64_t b, const ActivationTile& x) {
  if (b % 2 == 0) {
    _tile_loadd(2, block.codes, 64);
  } else {
    _tile_loadd(3, block.codes, 64);
  }
  for_each_product<Digits>(b, [&]<int Step, int B>(int digit) {
    product<Step, B>((digit == 0 ? x.q : x.q_low) + 32 * b, x.stride);
  });
}

// Block b's sums stored to sums[digit].
template <int Digits>
inline void store_block(int64_t b, int32_t (*sums)[16][16]) {
  for_each_product<Digits>(b, [&]<int Step, int>(int digit) { store_sums<Step>(sums[digit]); });
}

// Blocks [b0, b1) of one staged weight tile times the activation tile: their products' sums into
// sums[b - b0][digit]. A block's sums are stored after the next block's products are issued, so that the store
// does not hold those back while it waits for its own products.
template <int Digits>
void block_products(const StagedBlock* blocks, int64_t b0, int64_t b1, const ActivationTile& x,
                    int32_t (*sums)[Digits][16][16]) {
  constexpr int64_t kLag = Digits == 2 ? 1 : 2;  // blocks whose products are in flight: the C tiles hold 2 or 4
  for (int64_t b = b0; b < b1; ++b) {
    issue_block<Digits>(blocks[b], b, x);
    if (b - kLag >= b0) store_block<Digits>(b - kLag, sums[b - kLag - b0]);
  }
  for (int64_t b = std::max(b0, b1 - kLag); b < b1; ++b) store_block<Digits>(b, sums[b - b0]);
}

// R rows of x (R <= 16, the configured tile rows) against blocks [k0, k0 + n_blocks) of one staged weight tile (from
// `blocks`, the activation tile gathered over the same blocks), into out's 16 columns: the VNNI kernel's arithmetic
// on the sums the tile products give, in its order; its running sums acc kept in `out` between passes (zeros before
// the first).
template <int R, int Digits>
void activation_tile(const StagedBlock* blocks, int64_t n_blocks, const ActivationTile& x, bool first, float* out,
                     int64_t out_stride) {
  alignas(64) int32_t sums[kBlocksAtOnce][Digits][16][16];
  __m512 acc[R];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) acc[r] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(out + r * out_stride);
  for (int64_t b0 = 0; b0 < n_blocks; b0 += kBlocksAtOnce) {
    const int64_t b1 = std::min(n_blocks, b0 + kBlocksAtOnce);
    block_products<Digits>(blocks, b0, b1, x, sums);
    for (int64_t b = b0; b < b1; ++b) {
      const __m512 d = _mm512_loadu_ps(blocks[b].d);
      const float* d_x = x.d.data() + 16 * b;
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        __m512i dots = _mm512_load_si512(sums[b - b0][0][r]);
        if constexpr (Digits == 2) {
          dots = _mm512_add_epi32(_mm512_slli_epi32(dots, 8), _mm512_load_si512(sums[b - b0][1][r]));
        }
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots), _mm512_mul_ps(d, _mm512_set1_ps(d_x[r])), acc[r]);
      }
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(out + r * out_stride, acc[r]);
}

// The offsets m_w * s_r over a pass's blocks, added to the running sums at `offsets` (zeros before the first pass),
// as the VNNI kernel sums them apart from acc.
template <int R>
void add_offsets(const StagedBlock* blocks, int64_t n_blocks, const ActivationTile& x, bool first, float* offsets,
                 int64_t offsets_stride) {
  __m512 sum[R];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) sum[r] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(offsets + r * offsets_stride);
  for (int64_t b = 0; b < n_blocks; ++b) {
    const __m512 m = _mm512_loadu_ps(blocks[b].m);
    const float* s_x = x.s.data() + 16 * b;
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) sum[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(s_x[r]), sum[r]);
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(offsets + r * offsets_stride, sum[r]);
}

// activation_tile and add_offsets with R = rows (1 to 16).
template <int R, int Digits>
void activation_tile_of(int rows, const StagedBlock* blocks, int64_t n_blocks, const ActivationTile& x, bool first,
                        float* out, int64_t out_stride, float* offsets, int64_t offsets_stride) {
  if constexpr (R > 1) {
    if (rows < R) {
      return activation_tile_of<R - 1, Digits>(rows, blocks, n_blocks, x, first, out, out_stride, offsets,
                                               offsets_stride);
    }
  }
  activation_tile<R, Digits>(blocks, n_blocks, x, first, out, out_stride);
  add_offsets<R>(blocks, n_blocks, x, first, offsets, offsets_stride);
}

// Rows [row_begin, row_end) of w against every row of x: a group of weight tiles at a time (as many as kStagedBytes
// holds a pass of), pass after pass of kBlocksPerPass blocks, each made for the group and multiplied with every
// activation tile; acc runs in `out` and the offsets in a buffer of their own until out = acc + offsets.
template <PackedLayout Layout, int Digits>
void amx_tiles(const PackedWeight& w, int64_t row_begin, int64_t row_end, const IntegerActivations& x, float* out,
               int64_t out_stride) {
  thread_local std::vector<StagedBlock> staged;
  thread_local std::vector<float> offsets;
  thread_local ActivationTile activations;
  const int64_t n_blocks = w.cols / 32, pass_blocks = std::min(n_blocks, kBlocksPerPass);
  const int64_t tiles_at_once = std::max<int64_t>(1, kStagedBytes / int64_t(pass_blocks * sizeof(StagedBlock)));
  int configured_rows = 0;
  for (int64_t t0 = row_begin / kTileRows16; t0 < row_end / kTileRows16; t0 += tiles_at_once) {
    const int64_t t1 = std::min(t0 + tiles_at_once, row_end / kTileRows16), columns = (t1 - t0) * kTileRows16;
    staged.resize(size_t((t1 - t0) * pass_blocks));
    offsets.resize(size_t(x.rows * columns));
    for (int64_t k0 = 0; k0 < n_blocks; k0 += kBlocksPerPass) {
      const int64_t k1 = std::min(n_blocks, k0 + kBlocksPerPass);
      stage_tiles<Layout>(w, t0, t1, k0, k1, staged.data());
      for (int64_t a0 = 0; a0 < x.rows; a0 += 16) {
        const int rows = int(std::min<int64_t>(16, x.rows - a0));
        if (rows != configured_rows) {
          configure_tiles(rows);
          configured_rows = rows;
        }
        gather_activation_tile(x, a0, rows, k0, k1, activations);
        for (int64_t t = t0; t < t1; ++t) {
          activation_tile_of<16, Digits>(rows, staged.data() + (t - t0) * (k1 - k0), k1 - k0, activations, k0 == 0,
                                         out + a0 * out_stride + t * kTileRows16, out_stride,
                                         offsets.data() + a0 * columns + (t - t0) * kTileRows16, columns);
        }
      }
    }
    for (int64_t a = 0; a < x.rows; ++a) {
      float* row = out + a * out_stride + t0 * kTileRows16;
      for (int64_t c = 0; c < columns; c += 16) {
        const __m512 offset = _mm512_loadu_ps(&offsets[size_t(a * columns + c)]);
        _mm512_storeu_ps(row + c, _mm512_add_ps(_mm512_loadu_ps(row + c), offset));
      }
    }
  }
  if (configured_rows != 0) _tile_release();
}

template <PackedLayout Layout>
void amx_tiles_of(const PackedWeight& w, int64_t row_begin, int64_t row_end, const IntegerActivations& x, float* out,
                  int64_t out_stride) {
  if (x.digits == 2) return amx_tiles<Layout, 2>(w, row_begin, row_end, x, out, out_stride);
  amx_tiles<Layout, 1>(w, row_begin, row_end, x, out, out_stride);
}

}  // namespace

void quantized_dot_int8_amx(const PackedWeight& w, int64_t row_begin, int64_t row_end, const IntegerActivations& x,
                            float* out, int64_t out_stride) {
  if (x.rows >= kAmxMinRows) {
    switch (w.layout) {
      case PackedLayout::u4_rows16:
        return amx_tiles_of<PackedLayout::u4_rows16>(w, row_begin, row_end, x, out, out_stride);
      case PackedLayout::u8_rows16:
        return amx_tiles_of<PackedLayout::u8_rows16>(w, row_begin, row_end, x, out, out_stride);
      case PackedLayout::k4_rows16:
        return amx_tiles_of<PackedLayout::k4_rows16>(w, row_begin, row_end, x, out, out_stride);
      case PackedLayout::k5_rows16:
        return amx_tiles_of<PackedLayout::k5_rows16>(w, row_begin, row_end, x, out, out_stride);
      default: break;
    }
  }
  quantized_dot_int8_avx512_vnni(w, row_begin, row_end, x, out, out_stride);
}

}  // namespace strata::cpu


#pragma GCC diagnostic pop
#pragma GCC pop_options

#endif
