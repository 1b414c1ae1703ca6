// Causal attention over the paged KV cache, and the write of new keys and values into it (CPU reference).
// One code path serves prefill chunks and decode steps: query i of a sequence sees cache entries
// [0, n_ctx_before + i]. Entries are in cache order, which is also causal order, also after compression
// (policies only remove entries; new ones are always appended).
//
// Quantized blocks (kernels/kv_block_layout.h) are dequantized as they are read, one KV head's keys (or values) of
// a block at a time into a buffer that stays in the L1 cache, for all the query heads of that KV head; then they
// take the full-precision path. So are the full-precision blocks of a 16-bit pool (kv_cache.dtype f16 | bf16),
// widened to fp32 (kernels/cpu/kv_rows.h): attention reads half the bytes of an fp32 pool.
// Coded blocks (SpindleKV) are reconstructed as they are read: K = RoPE(m * C[r], position), V = m * C[r].
//
// A decode row is also cut along its keys (flash-decoding, split_row): each span's items give partial sums and
// the row's output is their rescaled sum. A lone decode row then gives the threads several items per KV head
// rather than one (bench/decode_attention.cpp; docs/decisions.md, [cpu-xeon]).
#include <algorithm>
#include <bit>
#include <cstdint>
#include <cmath>
#include <cstring>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/kv_codebook_ops.h"
#include "kernels/cpu/fast_exp.h"
#include "kernels/cpu/kv_rows.h"
#include "kernels/cpu/quantized_dot.h"
#include "kernels/cpu/simd_clones.h"
#include "kernels/cpu/thread_pool.h"

namespace strata::cpu {

void kv_write(const float* k, const float* v, std::span<const AttentionSequence> seqs, const KvPoolView& pool) {
  require_kv_element_type(pool, "kv_write");
  const KvBlockLayout& L = pool.layout;
  const int64_t row = int64_t(L.n_kv_heads) * L.head_dim;
  for (const AttentionSequence& s : seqs) {
    for (int i = 0; i < s.n_q; ++i) {
      const int entry = s.n_ctx_before + i;
      const int32_t id = s.block_table[entry / L.block_size];
      if (pool.is_quantized(id) || pool.is_coded(id)) {
        throw std::logic_error("kv_write: entry " + std::to_string(entry) + " falls in packed block " +
                               std::to_string(id) + " (new entries go to full-precision blocks)");
      }
      const int slot = entry % L.block_size;
      const int64_t src = int64_t(s.q_begin + i) * row;
      for (int h = 0; h < L.n_kv_heads; ++h) {
        write_kv_rows(pool, id, L.k_offset(h, slot), k + src + int64_t(h) * L.head_dim, L.head_dim);
        write_kv_rows(pool, id, L.v_offset(h, slot), v + src + int64_t(h) * L.head_dim, L.head_dim);
      }
    }
  }
}

namespace {

float dot(const float* a, const float* b, int n) {
  float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
  for (int i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

// A run of query rows of one sequence for heads [head_begin, head_end) of one KV head: they read the same keys
// and values, so the item brings each block into the cache once for all of them (a decode step reads the cache
// once per KV head, not once per query head). Rows that add to column sums stay in one item: one thread owns a
// head's sums, so no two threads add to the same cell.
struct QueryItem {
  int seq;
  int head_begin, head_end;
  int row_begin;  // query indices inside the sequence's rows
  int row_end;
  // A span of a decode row's keys (split_row): the item sums [key_begin, key_end) into partial sums at
  // partials[partial], which combine_spans makes into the row's output. partial < 0: the item sees every key its
  // rows see and writes its outputs itself.
  int key_begin = 0, key_end = 0;
  int64_t partial = -1;
};

// Query vectors (rows x heads of one KV head) of a tile, which pass over the keys and values their rows see
// together: each key chunk scored for all of them, each block's values summed for all. At 8, a long prompt's tiles
// read its keys and values from L3 four times as often (with vectors_values, a prefill after 3,968 entries 1.40x to
// 1.53x as fast at 32: bench/results/README.md).
constexpr int kTileRows = 32;
constexpr int kItemHeads = 8;          // query heads of one KV head that an item takes at most
constexpr int kTransposeVectors = 16;  // a sequence's query vectors that pay for transposing its keys
constexpr int kKeyChunk = 16;  // keys transposed and scored together
constexpr int kDimChunk = 64;  // output dimensions whose sums split even and odd rows (vectors_values)
constexpr int kValueVectors = 4;  // vectors whose value sums one pass over the rows adds together

// Per-thread buffers.
struct Workspace {
  std::vector<float> scores;       // [kTileRows][stride]: the tile's scores, then probabilities
  std::vector<float> dequantized;  // [block_size][head_dim]: a quantized or 16-bit block's keys or values of a KV head
  std::vector<float> coded_key;    // [head_dim]: a coded block's key, rebuilt
};

// Whether the kernels may use AVX-512's 32 zmm registers (engine.cpu_kernels may hold the level lower).
bool zmm_registers() { return best_cpu_isa() >= CpuIsa::avx512; }

// scores[t * stride + j] = scale * q_t . k_j for the tile's rows and the first n keys of a chunk held
// transposed in kt[d * kKeyChunk + j], kRows rows at a time whose sums stay in registers. Every (row, key) dot is
// summed over d in order, so a row's scores do not depend on which rows share its tile (nor on kRows). Inlined into
// chunk_scores, compiled for each of its levels.
template <int kRows>
[[gnu::always_inline]] inline void chunk_scores_rows(const float* const* q_rows, int rows, const float* kt, int hd,
                                                     int n, float scale, int64_t stride, float* scores) {
  for (int t0 = 0; t0 < rows; t0 += kRows) {
    const float* q[kRows];
    for (int t = 0; t < kRows; ++t) q[t] = q_rows[std::min(t0 + t, rows - 1)];
    float acc[kRows][kKeyChunk] = {};
    for (int d = 0; d < hd; ++d) {
      const float* k = kt + int64_t(d) * kKeyChunk;
      for (int t = 0; t < kRows; ++t) {
        const float qd = q[t][d];
#pragma omp simd
        for (int j = 0; j < kKeyChunk; ++j) acc[t][j] += qd * k[j];
      }
    }
    for (int t = 0; t < kRows && t0 + t < rows; ++t) {
      for (int j = 0; j < n; ++j) scores[(t0 + t) * stride + j] = acc[t][j] * scale;
    }
  }
}

// chunk_scores_rows with 8 rows at a time where AVX-512's 32 registers hold their sums (prefill 1.08x over 4), 4
// on AVX2's 16 (8 rows spilled some there).
STRATA_SIMD_CLONES
void chunk_scores(const float* const* q_rows, int rows, const float* kt, int hd, int n, float scale,
                  int64_t stride, float* scores) {
  if (zmm_registers()) return chunk_scores_rows<8>(q_rows, rows, kt, hd, n, scale, stride, scores);
  chunk_scores_rows<4>(q_rows, rows, kt, hd, n, scale, stride, scores);
}

// Sixteen floats as one value: a zmm register on AVX-512 (the vector extension of GCC and Clang).
using Lanes16 = float __attribute__((vector_size(64)));

// Lanes (Lanes16 or Lanes8) read from or written to any address (by reference: a vector returned by value
// changes the ABI between levels).
template <typename Lanes>
[[gnu::always_inline]] inline void load_lanes(const float* at, Lanes& x) {
  std::memcpy(&x, at, sizeof x);
}
template <typename Lanes>
[[gnu::always_inline]] inline void store_lanes(float* at, const Lanes& x) {
  std::memcpy(at, &x, sizeof x);
}

// o_t[d] += sum_j p_t[j] * v[j * hd + d] for kVectors vectors t over the same n value rows stored one after
// another: each row is read once for all of them. In the first `full` dimensions (a multiple of kDimChunk), taken
// kWidth Lanes at a time (six to eight sums in flight whatever kVectors), even and odd rows go to two sets of sums
// and o_t = o_t + even + odd. A vector's sums are the same whichever vectors share the pass and whichever Lanes,
// so its bits are too. Inlined into vectors_values, compiled for each of its levels.
template <typename Lanes, int kVectors, int kWidth>
[[gnu::always_inline]] inline void values_pass(const float* const* p, const float* v, int n, int hd, int full,
                                               float* const* o) {
  constexpr int kLanes = sizeof(Lanes) / sizeof(float);
  for (int d0 = 0; d0 < full; d0 += kLanes * kWidth) {
    Lanes even[kVectors][kWidth], odd[kVectors][kWidth];
    for (int t = 0; t < kVectors; ++t) {
      for (int w = 0; w < kWidth; ++w) {
        load_lanes(o[t] + d0 + kLanes * w, even[t][w]);
        odd[t][w] = Lanes{};
      }
    }
    int j = 0;
    for (; j + 1 < n; j += 2) {
      const float* v0 = v + int64_t(j) * hd + d0;
      for (int w = 0; w < kWidth; ++w) {
        Lanes a, b;
        load_lanes(v0 + kLanes * w, a);
        load_lanes(v0 + hd + kLanes * w, b);
        for (int t = 0; t < kVectors; ++t) {
          even[t][w] += p[t][j] * a;
          odd[t][w] += p[t][j + 1] * b;
        }
      }
    }
    if (j < n) {
      for (int w = 0; w < kWidth; ++w) {
        Lanes a;
        load_lanes(v + int64_t(j) * hd + d0 + kLanes * w, a);
        for (int t = 0; t < kVectors; ++t) even[t][w] += p[t][j] * a;
      }
    }
    for (int t = 0; t < kVectors; ++t) {
      for (int w = 0; w < kWidth; ++w) {
        const Lanes sum = even[t][w] + odd[t][w];
        store_lanes(o[t] + d0 + kLanes * w, sum);
      }
    }
  }
}

// values_pass for 1 to kValueVectors vectors, at a width that keeps six to eight sums in flight.
template <typename Lanes>
[[gnu::always_inline]] inline void values_passes(const float* const* p, int vectors, const float* v, int n, int hd,
                                                 int full, float* const* o) {
  switch (vectors) {
    case 1: return values_pass<Lanes, 1, 4>(p, v, n, hd, full, o);
    case 2: return values_pass<Lanes, 2, 2>(p, v, n, hd, full, o);
    case 3: return values_pass<Lanes, 3, 1>(p, v, n, hd, full, o);
    default: return values_pass<Lanes, 4, 1>(p, v, n, hd, full, o);
  }
}

// Eight floats as one value: a ymm register on AVX2 and AVX-512, two xmm on the baseline (the vector extension
// of GCC and Clang, so that each STRATA_SIMD_CLONES clone compiles it for its own level); Floats8 reads them at any
// address.
using Lanes8 = float __attribute__((vector_size(32)));
using Floats8 = float __attribute__((vector_size(32), aligned(4), may_alias));

// out[j] = scale * (the sum of the 8 lanes of a[j]). Three rounds halve the lanes each vector keeps and double the
// vectors each one holds (a transposition folded into the additions); the last shuffle puts them in order. Inlined
// into its callers, so it is compiled for their level.
[[gnu::always_inline]] inline void lane_sums(const Lanes8 (&a)[8], float scale, float* out) {
  Lanes8 half[4], quarter[2];
  for (int i = 0; i < 4; ++i) {  // [a_2i: 4 sums, a_2i+1: 4 sums]
    half[i] = __builtin_shufflevector(a[2 * i], a[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11) +
              __builtin_shufflevector(a[2 * i], a[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15);
  }
  for (int i = 0; i < 2; ++i) {  // 2 sums each of a_4i, a_4i+2, a_4i+1, a_4i+3
    quarter[i] = __builtin_shufflevector(half[2 * i], half[2 * i + 1], 0, 1, 8, 9, 4, 5, 12, 13) +
                 __builtin_shufflevector(half[2 * i], half[2 * i + 1], 2, 3, 10, 11, 6, 7, 14, 15);
  }
  // a_0, a_4, a_2, a_6, a_1, a_5, a_3, a_7
  const Lanes8 sums = __builtin_shufflevector(quarter[0], quarter[1], 0, 8, 2, 10, 4, 12, 6, 14) +
                      __builtin_shufflevector(quarter[0], quarter[1], 1, 9, 3, 11, 5, 13, 7, 15);
  *reinterpret_cast<Floats8*>(out) = __builtin_shufflevector(sums, sums, 0, 4, 2, 6, 1, 5, 3, 7) * scale;
}

// values_pass for 1 to kValueVectors vectors over the same n rows: in zmm registers (Lanes16) where AVX-512 has
// them, else in Lanes8 (as Lanes16, AVX2's code moved the sums through general registers); then the dimensions
// past the last kDimChunk summed row after row.
STRATA_SIMD_CLONES
void vectors_values(const float* const* p, int vectors, const float* v, int n, int hd, float* const* o) {
  const int full = hd - hd % kDimChunk;
  if (zmm_registers()) {
    values_passes<Lanes16>(p, vectors, v, n, hd, full, o);
  } else {
    values_passes<Lanes8>(p, vectors, v, n, hd, full, o);
  }
  if (full == hd) return;
  for (int t = 0; t < vectors; ++t) {
    for (int j = 0; j < n; ++j) {
      const float pj = p[t][j];
      const float* vj = v + int64_t(j) * hd;
#pragma omp simd
      for (int d = full; d < hd; ++d) o[t][d] += pj * vj[d];
    }
  }
}

// scores[j] = scale * q . k_j for n keys stored one after another (a row that scores few keys: no transposition).
// With head_dim a multiple of 8, eight keys at a time: each key's products summed into 8 lanes, its own chain, then
// the eight keys' lanes summed together (lane_sums), so no key waits on another's additions.
STRATA_SIMD_CLONES
void row_scores(const float* qv, const float* keys, int n, int hd, float scale, float* scores) {
  constexpr int kKeys = 8;
  if (hd % 8 != 0) {
    for (int j = 0; j < n; ++j) scores[j] = dot(qv, keys + int64_t(j) * hd, hd) * scale;
    return;
  }
  for (int j0 = 0; j0 < n; j0 += kKeys) {
    const int m = std::min(kKeys, n - j0);
    const float* k[kKeys];
    for (int j = 0; j < kKeys; ++j) k[j] = keys + int64_t(j0 + std::min(j, m - 1)) * hd;  // past m: a copy, dropped
    Lanes8 acc[kKeys] = {};
    for (int d = 0; d < hd; d += 8) {
      const Lanes8 q = *reinterpret_cast<const Floats8*>(qv + d);
#pragma GCC unroll 8
      for (int j = 0; j < kKeys; ++j) acc[j] += q * *reinterpret_cast<const Floats8*>(k[j] + d);
    }
    float s[kKeys];
    lane_sums(acc, scale, s);
    for (int j = 0; j < m; ++j) scores[j0 + j] = s[j];
  }
}

// A sequence's blocks made ready once per call for its many query rows (kernels that read a block again for every
// tile would dequantize it again too): the keys of its full-precision and quantized blocks transposed for
// chunk_scores, keys[(((h * n_blocks + b) * chunks + c) * hd + d) * kKeyChunk + j] being key c * kKeyChunk + j of
// block b for KV head h, and the values of its quantized blocks dequantized, values[((h * n_blocks + b) *
// block_size + j) * hd + d]. Coded blocks are left out (their slots stay unset), and so are the values of
// full-precision blocks: read where they are, or a 16-bit block's widened by each tile into its workspace (made
// ready for the whole call, they were a long prompt's megabytes, written before the first tile and read back:
// slower, in ad-hoc runs, and memory that grows with the context).
struct PreparedKv {
  std::vector<float> keys;
  std::vector<float> values;
  int n_blocks = 0;
  int chunks = 0;  // per block

  int64_t key_offset(int kv_head, int block, int c, int hd) const {
    return ((int64_t(kv_head) * n_blocks + block) * chunks + c) * hd * kKeyChunk;
  }
  int64_t value_offset(int kv_head, int block, int block_size, int hd) const {
    return (int64_t(kv_head) * n_blocks + block) * block_size * hd;
  }
};

// Whether block `id` is read where it is: a full-precision block of an fp32 pool. The others are made fp32 first.
bool read_in_place(const KvPoolView& pool, int32_t id) {
  return kv_rows_are_f32(pool) && !pool.is_quantized(id) && !pool.is_coded(id);
}

// Sequences with enough query rows to pay for the transposition; the others score keys row by row.
bool worth_transposing(const AttentionSequence& s, int group) { return s.n_q * group >= kTransposeVectors; }

// The first n keys of one KV head stored one after another, transposed in chunks of kKeyChunk.
void transpose_keys(const float* keys, int n, int hd, float* out) {
  for (int c0 = 0; c0 < n; c0 += kKeyChunk, out += int64_t(hd) * kKeyChunk) {
    const int m = std::min(kKeyChunk, n - c0);
    for (int j = 0; j < kKeyChunk; ++j) {
      const float* k = keys + int64_t(c0 + std::min(j, m - 1)) * hd;  // past m: a copy, scored and dropped
      for (int d = 0; d < hd; ++d) out[int64_t(d) * kKeyChunk + j] = k[d];
    }
  }
}

// Block `block` of a sequence, KV head `kv_head`, made ready in `ready` (see PreparedKv); `scratch` holds a
// quantized or 16-bit block's keys of one head on their way to being transposed.
void prepare_block(const KvPoolView& pool, int32_t id, int kv_head, int block, int n, PreparedKv& ready,
                   std::vector<float>& scratch) {
  const KvBlockLayout& L = pool.layout;
  const int hd = L.head_dim;
  float* keys_t = ready.keys.data() + ready.key_offset(kv_head, block, 0, hd);
  if (pool.is_coded(id)) return;
  if (read_in_place(pool, id)) {
    transpose_keys(pool.block_f32(id) + L.k_offset(kv_head, 0), n, hd, keys_t);
    return;
  }
  scratch.resize(size_t(L.block_size) * hd);
  read_head_entries(pool, id, kv_head, n, /*values=*/false, scratch.data());
  transpose_keys(scratch.data(), n, hd, keys_t);
  if (pool.is_quantized(id)) {
    read_head_entries(pool, id, kv_head, n, /*values=*/true,
                      ready.values.data() + ready.value_offset(kv_head, block, L.block_size, hd));
  }
}

// Where the keys (or values) of KV head `head` in block `id` are: one run of a full-precision block; three of a
// quantized one (its codes, scales and mins); none of a coded one.
struct HeadRuns {
  const uint8_t* at[3] = {};
  int64_t bytes[3] = {};
};

HeadRuns head_runs(const KvPoolView& pool, int32_t id, int head, bool values) {
  const KvBlockLayout& L = pool.layout;
  if (pool.is_coded(id)) return {};
  if (!pool.is_quantized(id)) {
    return {{kv_element(pool, id, values ? L.v_offset(head, 0) : L.k_offset(head, 0))},
            {int64_t(L.block_size) * L.head_dim * dtype_bytes(L.dtype)}};
  }
  const uint8_t* block = pool.block_quantized(id);
  const int64_t codes = int64_t(L.block_size) * L.code_row_bytes();
  if (values) {
    const int64_t scales = int64_t(L.block_size) * L.v_groups() * kKvScaleBytes;
    return {{block + L.v_codes_offset(head, 0), block + L.v_scale_offset(head, 0), block + L.v_min_offset(head, 0)},
            {codes, scales, scales}};
  }
  const int64_t scales = int64_t(L.head_dim) * kKvScaleBytes;
  return {{block + L.k_codes_offset(head, 0), block + L.k_scale_offset(head), block + L.k_min_offset(head)},
          {codes, scales, scales}};
}

// Asks for share `part` of `parts` of the lines of the next block's runs while this block's work goes on: the work
// on a block asks for the next one's lines a share before each query vector's pass. Blocks are a few KiB apart
// from one another, too short a run for the hardware prefetcher to find on its own; asked all at once, a block's 32
// to 64 lines filled the core's line fill buffers and it waited for them, then computed while they stood idle
// (after 4,096 entries a bf16 pool decodes 1.14x as fast so: bench/results/README.md). Contiguous shares (every
// parts-th line slowed decode down), by 32-bit divisions of the runs there are (64-bit ones cost prefill's many
// vectors more than their asking). Inlined always: GCC 12 takes a function that only prefetches for one without
// effects and drops its calls (docs/decisions.md, [cpu-xeon]); without this, decode attention asked for nothing.
[[gnu::always_inline]] inline void ask_share(const HeadRuns& next, int part, int parts) {
  for (int r = 0; r < 3; ++r) {
    if (next.bytes[r] == 0) continue;
    const int lines = int((next.bytes[r] + 63) >> 6), first = lines * part / parts, last = lines * (part + 1) / parts;
    for (int line = first; line < last; ++line) __builtin_prefetch(next.at[r] + int64_t(line) * 64);
  }
}

// scores[t * stride + j] = scale * q_t . k_j for the tile's vectors and the first n entries of block `id`, each
// block in the fastest form it allows, asking for the `next` block's keys meanwhile (ask_share). A block not read in
// place (quantized, coded or 16-bit) has each key dequantized (rebuilt from its codebook vector, widened) once for
// all the vectors: they are the query heads of one KV head.
void block_scores(const float* const* q_rows, int vectors, const KvPoolView& pool, int32_t id, int kv_head, int n,
                  float scale, int64_t stride, const HeadRuns& next, Workspace& ws, float* scores) {
  const KvBlockLayout& L = pool.layout;
  const int hd = L.head_dim;
  if (pool.is_coded(id)) {
    ask_share(next, 0, 1);
    const KvCodeRow* rows = pool.block_coded(id) + L.code_row_index(kv_head, 0);
    for (int j = 0; j < n; ++j) {
      coded_key(pool, rows[j], ws.coded_key.data());
      for (int t = 0; t < vectors; ++t) scores[t * stride + j] = dot(q_rows[t], ws.coded_key.data(), hd) * scale;
    }
    return;
  }
  const float* keys = ws.dequantized.data();
  if (read_in_place(pool, id)) {
    keys = pool.block_f32(id) + L.k_offset(kv_head, 0);
  } else {
    read_head_entries(pool, id, kv_head, n, /*values=*/false, ws.dequantized.data());
  }
  for (int t = 0; t < vectors; ++t) {
    ask_share(next, t, vectors);
    row_scores(q_rows[t], keys, n, hd, scale, scores + t * stride);
  }
}

// o_t += sum_j p_t[j] * v_j for the tile's vectors over the first n_t entries of one block (n_t <= 0: none),
// asking for the `next` block's values meanwhile (ask_share). A quantized (16-bit) block is dequantized (widened)
// once for all the vectors, unless `ready_values` holds it so.
void block_values(const float* const* p, const int* n, int vectors, const KvPoolView& pool, int32_t id, int kv_head,
                  const float* ready_values, const HeadRuns& next, Workspace& ws, float* const* o) {
  const KvBlockLayout& L = pool.layout;
  const int hd = L.head_dim;
  if (pool.is_coded(id)) {
    ask_share(next, 0, 1);
    const KvCodeRow* rows = pool.block_coded(id) + L.code_row_index(kv_head, 0);
    for (int t = 0; t < vectors; ++t) {
      for (int j = 0; j < n[t]; ++j) {
        const float a = p[t][j] * rows[j].v_magnitude;
        const float* c = pool.codebook_vector(rows[j].v_vector);
        for (int d = 0; d < hd; ++d) o[t][d] += a * c[d];
      }
    }
    return;
  }
  const float* values = ws.dequantized.data();
  if (read_in_place(pool, id)) {
    values = pool.block_f32(id) + L.v_offset(kv_head, 0);
  } else if (ready_values) {
    values = ready_values;
  } else if (const int n_max = *std::max_element(n, n + vectors); n_max > 0) {
    read_head_entries(pool, id, kv_head, n_max, /*values=*/true, ws.dequantized.data());
  }
  // Runs of vectors that sum the same rows (all but a row's last block), kValueVectors at most, pass together in a
  // tile of more vectors than a run holds (prefill). A decode step's few go one by one, so that a share of the next
  // block's lines is asked for before each: together, asked all at once, decode over bf16 blocks ran 0.86-0.95x.
  const int most = vectors > kValueVectors ? kValueVectors : 1;
  for (int t0 = 0, t1 = 0; t0 < vectors; t0 = t1) {
    for (t1 = t0 + 1; t1 < vectors && t1 - t0 < most && n[t1] == n[t0];) ++t1;
    for (int t = t0; t < t1; ++t) ask_share(next, t, vectors);
    if (n[t0] > 0) vectors_values(p + t0, t1 - t0, values, n[t0], hd, o + t0);
  }
}

// Replaces n > 0 scores s by exp(s - max) in place; returns the max, and their sum in *sum.
STRATA_SIMD_CLONES
float exp_shifted(float* s, int n, float* sum) {
  float max_score = s[0];
#pragma omp simd reduction(max : max_score)
  for (int e = 0; e < n; ++e) max_score = s[e] > max_score ? s[e] : max_score;
  float total = 0.0f;
#pragma omp simd
  for (int e = 0; e < n; ++e) s[e] = exp_nonpositive(s[e] - max_score);
#pragma omp simd reduction(+ : total)
  for (int e = 0; e < n; ++e) total += s[e];
  *sum = total;
  return max_score;
}

// Turns one row's scores into probabilities in place.
STRATA_SIMD_CLONES
void softmax(float* s, int n) {
  float sum;
  exp_shifted(s, n, &sum);
  const float inv_sum = 1.0f / sum;
#pragma omp simd
  for (int e = 0; e < n; ++e) s[e] *= inv_sum;
}

// A span's fixed costs (its item, its partial sums, their combination) stay small beside its keys: with spans of
// 32 keys, batches of short rows became slower than unsplit (bench/decode_attention.cpp, batch 8 at 256 keys).
constexpr int kMinSpanKeys = 128;
constexpr int kMaxSpans = 8;  // per decode row and head group: items enough for the threads

// Keys per span of a decode row that sees n_keys keys: whole blocks, at least kMinSpanKeys, at most kMaxSpans
// spans. It depends on the row alone, so a row is cut the same way, and gets the same bits, in any batch.
int span_keys(int n_keys, int block_size) {
  const int n_blocks = (n_keys + block_size - 1) / block_size;
  return block_size * std::max((kMinSpanKeys + block_size - 1) / block_size, (n_blocks + kMaxSpans - 1) / kMaxSpans);
}

// A row split along its keys (flash-decoding): a decode row that sees more keys than a span, without column
// statistics (they need the whole row's probabilities). Unsplit, a lone decode row makes one item per KV head,
// fewer than the threads or not a multiple of them (SmolLM2: 3 for 2 threads, one waiting while the other does two).
bool split_row(const AttentionSequence& s, int block_size) {
  return s.n_q == 1 && s.column_sums == nullptr && s.n_ctx_before + 1 > span_keys(s.n_ctx_before + 1, block_size);
}

// The query items of a step: per sequence, a KV head's group of heads, in parts of at most kItemHeads, and rows in
// parts of as many as fit beside them. The rows that add to column sums (from stats_row_begin: an observation
// window, or every row) stay in one item, which adds them in row order; the rows before them are split like any.
// A split row (split_row) has an item per span instead, numbered in partial_floats, which ends as the count of
// the partial sums' floats.
std::vector<QueryItem> query_items(std::span<const AttentionSequence> seqs, int n_heads, int group,
                                   const KvBlockLayout& layout, int64_t& partial_floats) {
  const int item_heads = std::min(group, kItemHeads);
  std::vector<QueryItem> items;
  partial_floats = 0;
  for (int s = 0; s < int(seqs.size()); ++s) {
    const int n_q = seqs[s].n_q;
    const int sums_from = seqs[s].column_sums ? std::clamp(seqs[s].stats_row_begin, 0, n_q) : n_q;
    const bool split = split_row(seqs[s], layout.block_size);
    const int n_keys = seqs[s].n_ctx_before + 1, span = span_keys(n_keys, layout.block_size);  // used when split
    for (int h0 = 0; h0 < n_heads; h0 += item_heads) {
      const int h1 = std::min(h0 + item_heads, (h0 / group + 1) * group);
      if (split) {
        for (int k0 = 0; k0 < n_keys; k0 += span) {
          items.push_back({s, h0, h1, 0, 1, k0, std::min(k0 + span, n_keys), partial_floats});
          partial_floats += int64_t(h1 - h0) * (layout.head_dim + 2);
        }
        continue;
      }
      const int step = std::max(1, kTileRows / (h1 - h0));
      for (int i = 0; i < sums_from; i += step) items.push_back({s, h0, h1, i, std::min(i + step, sums_from)});
      if (sums_from < n_q) items.push_back({s, h0, h1, sums_from, n_q});
    }
  }
  return items;
}

// The blocks of every sequence with rows enough to pay for it (worth_transposing) made ready, block by block in
// parallel; an empty PreparedKv for the others.
std::vector<PreparedKv> prepared_kv(std::span<const AttentionSequence> seqs, const KvPoolView& pool, int group) {
  const KvBlockLayout& L = pool.layout;
  std::vector<PreparedKv> prepared(seqs.size());
  struct PrepareTask {
    int seq, kv_head, block;
  };
  std::vector<PrepareTask> tasks;
  for (int s = 0; s < int(seqs.size()); ++s) {
    if (!worth_transposing(seqs[s], group)) continue;
    PreparedKv& ready = prepared[size_t(s)];
    ready.n_blocks = (seqs[s].n_ctx_before + seqs[s].n_q + L.block_size - 1) / L.block_size;
    ready.chunks = (L.block_size + kKeyChunk - 1) / kKeyChunk;
    ready.keys.resize(size_t(L.n_kv_heads) * ready.n_blocks * ready.chunks * L.head_dim * kKeyChunk);
    if (L.quant != KvQuant::none) {
      ready.values.resize(size_t(L.n_kv_heads) * ready.n_blocks * L.block_size * L.head_dim);
    }
    for (int h = 0; h < L.n_kv_heads; ++h) {
      for (int b = 0; b < ready.n_blocks; ++b) tasks.push_back({s, h, b});
    }
  }
  parallel_for(int64_t(tasks.size()), 16, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> scratch;
    for (size_t i = size_t(begin); i < size_t(end); ++i) {
      const PrepareTask& task = tasks[i];
      const AttentionSequence& s = seqs[size_t(task.seq)];
      const int n = std::min(L.block_size, s.n_ctx_before + s.n_q - task.block * L.block_size);
      prepare_block(pool, s.block_table[task.block], task.kv_head, task.block, n, prepared[size_t(task.seq)],
                    scratch);
    }
  });
  return prepared;
}

// The scores of a tile's query vectors (q_rows, `vectors` of them) against the keys [key_begin, key_end)
// (key_begin at a block's start), block by block, each block in the fastest form it allows; vector t's score of
// key e at scores[t * (key_end - key_begin) + e - key_begin].
void tile_scores(const float* const* q_rows, int vectors, const AttentionSequence& s, int key_begin, int key_end,
                 const KvPoolView& pool, int kv_head, const PreparedKv& ready, float scale, Workspace& ws,
                 float* scores) {
  const KvBlockLayout& L = pool.layout;
  const int hd = L.head_dim;
  const int64_t stride = key_end - key_begin;
  for (int e0 = key_begin; e0 < key_end; e0 += L.block_size) {
    const int block = e0 / L.block_size;
    const int32_t id = s.block_table[block];
    const int n = std::min(L.block_size, key_end - e0);
    float* scores_from = scores + (e0 - key_begin);
    if (ready.n_blocks > 0 && !pool.is_coded(id)) {
      for (int c0 = 0, c = 0; c0 < n; c0 += kKeyChunk, ++c) {
        chunk_scores(q_rows, vectors, ready.keys.data() + ready.key_offset(kv_head, block, c, hd), hd,
                     std::min(kKeyChunk, n - c0), scale, stride, scores_from + c0);
      }
      continue;
    }
    const HeadRuns next =
        e0 + L.block_size < key_end ? head_runs(pool, s.block_table[block + 1], kv_head, /*values=*/false) : HeadRuns{};
    block_scores(q_rows, vectors, pool, id, kv_head, n, scale, stride, next, ws, scores_from);
  }
}

// KVzip's statistic of one row: its probabilities p over n_keys renormalized over [0, sinks) and [from, n_keys),
// each kept in maxima where larger.
void add_renormalized_maxima(const ColumnMaxima& range, const float* p, int n_keys, float* maxima) {
  const int sinks = std::min(range.sinks, n_keys), from = std::clamp(range.from, sinks, n_keys);
  double mass = 0.0;
  for (int e = 0; e < sinks; ++e) mass += p[e];
  for (int e = from; e < n_keys; ++e) mass += p[e];
  if (mass <= 0.0) return;
  const float inv_mass = float(1.0 / mass);
  for (int e = 0; e < sinks; ++e) maxima[e] = std::max(maxima[e], p[e] * inv_mass);
  for (int e = from; e < n_keys; ++e) maxima[e] = std::max(maxima[e], p[e] * inv_mass);
}

// Query vector t of the tile (row, head), whose scores are at p: its softmax over the keys its row sees, added to
// the head's column sums (or its maxima).
void vector_probabilities(const AttentionSequence& s, int row, int head, float* p) {
  const int n_keys = s.n_ctx_before + row + 1;
  softmax(p, n_keys);
  float* sums = s.column_sums ? s.column_sums + int64_t(head) * s.sums_stride : nullptr;
  if (!sums || row < s.stats_row_begin) return;
  if (s.column_maxima) return add_renormalized_maxima(*s.column_maxima, p, n_keys, sums);
  for (int e = 0; e < n_keys; ++e) sums[e] += p[e];
}

// o_t = sum_e p_t[e - key_begin] v_e over the keys [key_begin, key_end[t]) of each of the vectors (key_begin at a
// block's start; key_end[t] <= key_begin: none), block by block for all of them together.
void sum_values(const AttentionSequence& s, int key_begin, const float* const* p, const int* key_end, int vectors,
                int kv_head, const KvPoolView& pool, const PreparedKv& ready, Workspace& ws, float* const* o) {
  const KvBlockLayout& L = pool.layout;
  for (int t = 0; t < vectors; ++t) std::fill(o[t], o[t] + L.head_dim, 0.0f);
  const int last = *std::max_element(key_end, key_end + vectors);
  for (int e0 = key_begin; e0 < last; e0 += L.block_size) {
    const int block = e0 / L.block_size;
    const int32_t id = s.block_table[block];
    const float* ready_values = nullptr;
    HeadRuns next;
    if (!ready.values.empty() && pool.is_quantized(id)) {
      ready_values = ready.values.data() + ready.value_offset(kv_head, block, L.block_size, L.head_dim);
    } else if (e0 + L.block_size < last) {
      next = head_runs(pool, s.block_table[block + 1], kv_head, /*values=*/true);
    }
    const float* p_block[kTileRows];
    int n_block[kTileRows];
    for (int t = 0; t < vectors; ++t) {
      p_block[t] = p[t] + (e0 - key_begin);
      n_block[t] = std::min(L.block_size, key_end[t] - e0);
    }
    block_values(p_block, n_block, vectors, pool, id, kv_head, ready_values, next, ws, o);
  }
}

// The outputs of vectors [first, first + vectors) of the tile (vector t: row r0 + t / heads, head head_begin +
// t % heads, probabilities at scores + t * stride): the weighted sums of the values each row sees.
void tile_outputs(const AttentionSequence& s, int r0, int first, int vectors, int heads, int head_begin, int kv_head,
                  const KvPoolView& pool, const PreparedKv& ready, const float* scores, int64_t stride,
                  int64_t q_row, Workspace& ws, float* out) {
  const float* p[kTileRows];
  float* o[kTileRows];
  int n_keys[kTileRows];
  for (int i = 0; i < vectors; ++i) {
    const int t = first + i, row = r0 + t / heads;
    p[i] = scores + t * stride;
    n_keys[i] = s.n_ctx_before + row + 1;
    o[i] = out + int64_t(s.q_begin + row) * q_row + int64_t(head_begin + t % heads) * pool.layout.head_dim;
  }
  sum_values(s, 0, p, n_keys, vectors, kv_head, pool, ready, ws, o);
}

// The partial sums of a span item (a decode row's heads over the keys [key_begin, key_end)), per head t at
// partial + t * (head_dim + 2): o = sum_e exp(s_e - m) v_e, then m = max_e s_e, then l = sum_e exp(s_e - m).
void span_partials(const QueryItem& item, const AttentionSequence& s, const float* q, int64_t q_row, int kv_head,
                   const KvPoolView& pool, const PreparedKv& ready, float scale, Workspace& ws, float* partial) {
  const int hd = pool.layout.head_dim, vectors = item.head_end - item.head_begin;
  const int n = item.key_end - item.key_begin;
  if (ws.scores.size() < size_t(vectors * n)) ws.scores.resize(size_t(vectors * n));
  const float* q_rows[kTileRows];
  const float* p[kTileRows];
  float* o[kTileRows];
  int key_end[kTileRows];
  for (int t = 0; t < vectors; ++t) {
    q_rows[t] = q + int64_t(s.q_begin) * q_row + int64_t(item.head_begin + t) * hd;
    p[t] = ws.scores.data() + int64_t(t) * n;
    o[t] = partial + int64_t(t) * (hd + 2);
    key_end[t] = item.key_end;
  }
  tile_scores(q_rows, vectors, s, item.key_begin, item.key_end, pool, kv_head, ready, scale, ws, ws.scores.data());
  for (int t = 0; t < vectors; ++t) o[t][hd] = exp_shifted(ws.scores.data() + int64_t(t) * n, n, &o[t][hd + 1]);
  sum_values(s, item.key_begin, p, key_end, vectors, kv_head, pool, ready, ws, o);
}

// The outputs of a split row's head group from its span items (`spans`, in key order): per head, the spans' sums
// rescaled to their largest max M, out = sum_i e^(m_i - M) o_i / sum_i e^(m_i - M) l_i.
void combine_spans(std::span<const QueryItem> spans, const AttentionSequence& s, const float* partials, int hd,
                   int64_t q_row, float* out) {
  const int64_t part = hd + 2;
  for (int t = 0; t < spans.front().head_end - spans.front().head_begin; ++t) {
    float m = -std::numeric_limits<float>::infinity();
    for (const QueryItem& span : spans) m = std::max(m, partials[span.partial + t * part + hd]);
    float* o = out + int64_t(s.q_begin) * q_row + int64_t(spans.front().head_begin + t) * hd;
    std::fill(o, o + hd, 0.0f);
    float l = 0.0f;
    for (const QueryItem& span : spans) {
      const float* partial = partials + span.partial + t * part;
      const float w = std::exp(partial[hd] - m);
      l += w * partial[hd + 1];
      for (int d = 0; d < hd; ++d) o[d] += w * partial[d];
    }
    const float inv_l = 1.0f / l;
    for (int d = 0; d < hd; ++d) o[d] *= inv_l;
  }
}

}  // namespace

// Work is split into tiles of up to kTileRows query vectors (rows x heads of one KV head). A tile's scores are
// computed block by block against every key its last row sees (keys a row cannot see are scored and ignored); then
// each vector takes its softmax, adds its head's column sums, and sums its values. A split decode row's items
// each do the same over their span, and the spans are combined at the end.
void paged_attention(const float* q, std::span<const AttentionSequence> seqs, const KvPoolView& pool, int n_heads,
                     float scale, float* out) {
  require_kv_element_type(pool, "paged_attention");
  const KvBlockLayout& L = pool.layout;
  const int hd = L.head_dim;
  const int group = n_heads / L.n_kv_heads;
  const int64_t q_row = int64_t(n_heads) * hd;
  int64_t partial_floats = 0;
  const std::vector<QueryItem> items = query_items(seqs, n_heads, group, L, partial_floats);
  const std::vector<PreparedKv> prepared = prepared_kv(seqs, pool, group);
  std::vector<float> partials(static_cast<size_t>(partial_floats));

  // Items of a few query rows each (a decode row has one per span and head group): small chunks, so that every
  // core gets work.
  const int64_t grain = std::clamp<int64_t>(int64_t(items.size()) / (8 * compute_pool().size()), 1, 4);
  parallel_for(int64_t(items.size()), grain, [&](int64_t begin, int64_t end) {
    thread_local Workspace ws;  // the pool's threads live on: their buffers are kept between calls
    ws.dequantized.resize(size_t(L.block_size) * hd);
    ws.coded_key.resize(size_t(hd));
    for (size_t it = size_t(begin); it < size_t(end); ++it) {
      const QueryItem& item = items[it];
      const AttentionSequence& s = seqs[item.seq];
      const int heads = item.head_end - item.head_begin;
      const int kv_head = item.head_begin / group;
      if (item.partial >= 0) {
        span_partials(item, s, q, q_row, kv_head, pool, prepared[size_t(item.seq)], scale, ws,
                      partials.data() + item.partial);
        continue;
      }
      const int tile_rows = std::max(1, kTileRows / heads);
      for (int r0 = item.row_begin; r0 < item.row_end; r0 += tile_rows) {
        // The tile's query vectors, row by row, each row's heads in order: vector t is row r0 + t / heads, head
        // head_begin + t % heads.
        const int rows = std::min(tile_rows, item.row_end - r0), vectors = rows * heads;
        const int n_tile_keys = s.n_ctx_before + r0 + rows;  // keys the tile's last row sees
        const int64_t stride = n_tile_keys;
        if (ws.scores.size() < size_t(vectors * stride)) ws.scores.resize(size_t(vectors * stride));
        const float* q_rows[kTileRows];
        for (int t = 0; t < vectors; ++t) {
          q_rows[t] = q + int64_t(s.q_begin + r0 + t / heads) * q_row + int64_t(item.head_begin + t % heads) * hd;
        }
        tile_scores(q_rows, vectors, s, 0, n_tile_keys, pool, kv_head, prepared[size_t(item.seq)], scale, ws,
                    ws.scores.data());
        // The vectors sum their values together, block by block, so that each block comes into the L1 cache once
        // for all of them (a quantized block is dequantized once; at f32, prefill over 4K entries is 1.25x faster
        // than vector by vector: bench/results/cpu-f32-prefill-together-before-after.json). Except one row at f32
        // (decode): each vector then goes alone, its softmax then its values, while its probabilities are in the
        // L1 cache (3% faster: bench/results/cpu-f32-attention-before-after.json). Either way a vector adds its
        // values in the same order, so the results are the same bits.
        const int together = L.quant == KvQuant::none && rows == 1 ? 1 : vectors;
        for (int t0 = 0; t0 < vectors; t0 += together) {
          for (int t = t0; t < t0 + together; ++t) {
            vector_probabilities(s, r0 + t / heads, item.head_begin + t % heads, ws.scores.data() + t * stride);
          }
          tile_outputs(s, r0, t0, together, heads, item.head_begin, kv_head, pool, prepared[size_t(item.seq)],
                       ws.scores.data(), stride, q_row, ws, out);
        }
      }
    }
  });

  // The split rows' spans, which follow one another in items: a run per row and head group.
  std::vector<std::span<const QueryItem>> runs;
  for (size_t i = 0, j = 0; i < items.size(); i = j) {
    for (j = i + 1; j < items.size() && items[i].partial >= 0 && items[j].partial >= 0 &&
                    items[j].seq == items[i].seq && items[j].head_begin == items[i].head_begin;) {
      ++j;
    }
    if (items[i].partial >= 0) runs.push_back(std::span<const QueryItem>(items).subspan(i, j - i));
  }
  parallel_for(int64_t(runs.size()), 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      combine_spans(runs[size_t(r)], seqs[size_t(runs[size_t(r)].front().seq)], partials.data(), hd, q_row, out);
    }
  });
}

}  // namespace strata::cpu
