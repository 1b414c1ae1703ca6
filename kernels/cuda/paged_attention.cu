// The cache write and causal paged attention of the CUDA backend (kernels/cpu/paged_attention.cpp is the
// reference). Keys and values are read from bf16 full-precision blocks, from KIVI-quantized blocks (int8 | int4 | int2,
// dequantized as they are read: x = min + code * scale) or from SpindleKV's coded blocks (reconstructed as they
// are read: K = RoPE(k_magnitude * C[k_vector], position) with the pool's key RoPE table, V = v_magnitude *
// C[v_vector], the codebook vectors fp32; kernels/kv_block_layout.h). All arithmetic is fp32, the softmax online
// (running max m, running sum l, output rescaled when m grows).
//
// Block ids are resolved on the host (kv_device.cuh): each table entry becomes the byte offset of its block
// from the pool's base, stored as `offset` for a full-precision block and `~offset` (negative) for a packed one.
// A pool packs quantized blocks or coded blocks, never both, so a packed block is quantized in a quantized pool
// (KvGeometry::bits != 0) and coded in a pool without quantization (bits == 0): kernels tell the three formats
// apart without knowing the pool's slot count, and full-precision blocks cost one sign test.
//
// A coded entry is read channel by channel like the other formats: channel c of a key takes the codebook vector
// at both channels of c's RoPE pair and the cos and sin of the entry's position, all fp32 from global memory
// (a codebook vector serves many entries and a table row every KV head, so L1 and L2 hold most of it). The
// arithmetic is the CPU's, operation for operation (kv_device.cuh).
//
// Kernels (D = head_dim, C = D / 32 channels per lane; D is 64 or 128, a template parameter):
// - kv_write_kernel: block (token) copies the token's K and V rows, all KV heads, into its slot (bf16).
// - decode_tiled_kernel (sequences with one new row, every block of the call full-precision): flash-decoding with a
//   lane per entry: block (split, KV head, head chunk) as decode_kernel's below, each warp scoring a tile of 32
//   entries at once, their keys read by 16-byte loads, one reduction per query head and tile.
// - decode_kernel (sequences with one new row, any block format): flash-decoding. The context is cut into splits;
//   block (split, KV head, head chunk) of kThreads threads reads each key and value of its split once for up to
//   kMaxGroup query heads of the KV head (GQA; a larger group, such as Llama 3.1 405B's 16, takes several chunks, each
//   reading the split again). Each warp takes every kWarps-th entry of the split, its lanes holding C contiguous
//   channels; a score is a warp-wide sum. The warps' states merge in shared memory into one partial (m, l, o) per
//   (split, query head); decode_combine_kernel, block (sequence, query head), merges the splits.
// - prefill_kernel (sequences with several new rows): block (tile of kTileRows rows, query head) walks the keys
//   in tiles of kTileKeys, staged in shared memory as fp32. Warp w owns rows w, w + kWarps, ...: lane j scores key
//   j of the tile for each of them, the warp updates their softmax states, then each lane accumulates channels
//   lane, lane + 32, ... of their outputs. No score matrix beyond one tile ever exists.
// - column_sums_kernel: the statistics pass. Once the rows' final m and l are known, block (tile of kTileKeys
//   entries, query head) of one sequence recomputes each stats row's scores for its entries and adds
//   p = exp(s - m) / l per entry. Each block owns its cells: no atomics, and the sums are deterministic.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/kv_device.cuh"
#include "kernels/cuda/overlapped_launch.cuh"

namespace strata::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;  // every kernel here but the combine
constexpr int kMaxGroup = 8;           // query heads that one decode_kernel block keeps in registers
constexpr int kTileRows = 32;          // prefill: query rows per block
constexpr int kTileKeys = 32;          // prefill and column sums: keys per shared-memory tile (one per lane)
constexpr int kRowsPerWarp = kTileRows / kWarps;
constexpr int kMinSplitKeys = 64;      // decode_kernel: the fewest entries a split is given (128 left batch 1 at
                                       // 1K context with 64 blocks for 132 multiprocessors)
constexpr int kMinTiledSplitKeys = 32 * kWarps;  // decode_tiled_kernel: a tile of 32 entries for each warp

// Blocks per multiprocessor that decode_kernel is built for (__launch_bounds__): the registers its loop fits in
// without spilling, 80 at head_dim 64 (C = 2) and 128 at head_dim 128. Left to itself, ptxas gives the rarely
// taken coded-entry reads 12 more registers at head_dim 64, and the kernel one block less per multiprocessor.
// (Reading 4 entries a warp at once needed 156 registers at head_dim 128, so 3 blocks: on an H200 batch 64 at 1K
// and every batch at 32K decoded slower, docs/decisions.md.)
template <int C>
constexpr int kDecodeBlocksPerSm = C == 2 ? 6 : 4;

// One sequence of the call as the kernels see it; blocks[table_begin + j] is the encoded offset of its block j.
struct SeqDesc {
  int32_t q_begin;
  int32_t n_q;
  int32_t n_ctx_before;
  int32_t table_begin;
};
struct DecodeItem {  // a split: entries [key_begin, key_end) of sequence seq
  int32_t seq, key_begin, key_end, unused;
};
struct DecodeSeq {  // the splits of one decode sequence: items [first_item, first_item + n_items)
  int32_t seq, first_item, n_items, unused;
};
struct TileItem {  // prefill: rows [row_begin, row_begin + kTileRows) of seq; column sums: entries [key_begin, +32)
  int32_t seq, begin;
};

// ---- Reading one entry -------------------------------------------------------------------------------------

// A packed block (encoded offset < 0) is a coded one in a pool without quantization, a quantized one otherwise.
__device__ inline bool packed_is_coded(const KvGeometry& g) { return g.bits == 0; }

// Channel c of the key (or value) of entry `slot` of KV head `head` in the block at encoded offset `blk`. D is
// g.head_dim as a constant: a channel's RoPE pair then costs shifts and masks, not divisions, which also keeps
// prefill_kernel at the registers it has without coded reads.
template <int D>
__device__ inline float read_key(const uint8_t* pool, int64_t blk, const KvGeometry& g, const KeyRopeTable& rope,
                                 int head, int slot, int c) {
  if (blk >= 0) return load_bf16(pool, blk, g.k_element(head, slot) + c);
  if (packed_is_coded(g)) return coded_key_channel(pool, code_row(pool, ~blk, g, head, slot), rope, D, c);
  return dequantize_key(pool + ~blk, head, slot, c, g);
}
template <int D>
__device__ inline float read_value(const uint8_t* pool, int64_t blk, const KvGeometry& g, int head, int slot,
                                   int c) {
  if (blk >= 0) return load_bf16(pool, blk, g.v_element(head, slot) + c);
  if (packed_is_coded(g)) return coded_value_channel(pool, code_row(pool, ~blk, g, head, slot), D, c);
  return dequantize_value(pool + ~blk, head, slot, c, g);
}

// Channels [lane * C, lane * C + C) of one entry's key and value, the whole warp reading the same entry.
// Full-precision rows are read two channels at a time (bf16 pairs: the row starts at a multiple of D elements and
// lane * C is even, so every pair is aligned).
template <int C>
__device__ inline void read_entry(const uint8_t* pool, int64_t blk, const KvGeometry& g, const KeyRopeTable& rope,
                                  int head, int slot, int lane, float (&k)[C], float (&v)[C]) {
  if (blk >= 0) {
    const auto* kp = reinterpret_cast<const __nv_bfloat162*>(
        reinterpret_cast<const __nv_bfloat16*>(pool + blk) + g.k_element(head, slot) + lane * C);
    const auto* vp = reinterpret_cast<const __nv_bfloat162*>(
        reinterpret_cast<const __nv_bfloat16*>(pool + blk) + g.v_element(head, slot) + lane * C);
#pragma unroll
    for (int j = 0; j < C / 2; ++j) {
      const float2 kf = __bfloat1622float2(kp[j]), vf = __bfloat1622float2(vp[j]);
      k[2 * j] = kf.x;
      k[2 * j + 1] = kf.y;
      v[2 * j] = vf.x;
      v[2 * j + 1] = vf.y;
    }
    return;
  }
  if (packed_is_coded(g)) {
    // RoPE pairs channel c with c ^ 1 (interleaved: the same lane) or with c +- D / 2 (neox: the same j of lane
    // ^ 16), so each lane loads only its own channels of the key's codebook vector and gets the neox partners by
    // shuffle: coded_key_channel's operations with one codebook load per channel instead of two.
    constexpr int D = 32 * C;
    const KvCodeRow row = code_row(pool, ~blk, g, head, slot);
    const float* key_vector = codebook_vector(pool, row.k_vector, D);
    const float* value_vector = codebook_vector(pool, row.v_vector, D);
    float x[C];  // the key before RoPE
#pragma unroll
    for (int j = 0; j < C; ++j) x[j] = __fmul_rn(row.k_magnitude, key_vector[lane * C + j]);
#pragma unroll
    for (int j = 0; j < C; ++j) {
      const int c = lane * C + j;
      const float across = __shfl_xor_sync(0xffffffffu, x[j], 16);
      const float partner = rope.interleaved ? x[j ^ 1] : across;
      int a, b, i;
      rope_pair(rope, D, c, a, b, i);
      k[j] = c == a ? rope_channel(rope, D, row.position, 1.0f, c, x[j], partner)
                    : rope_channel(rope, D, row.position, 1.0f, c, partner, x[j]);
      v[j] = __fmul_rn(row.v_magnitude, value_vector[c]);
    }
    return;
  }
  // A quantized entry, as dequantize_key and dequantize_value read it, with fewer loads: the lane's C codes lie in
  // one aligned 32-bit word of their row (C * bits divides 32, rows start at multiples of 4 bytes), and its C value
  // channels in one group of 32 (one scale and min).
  static_assert(C * 8 <= 32, "a lane's codes must fit one 32-bit word");
  const uint8_t* block = pool + ~blk;
  const int first_bit = lane * C * g.bits, mask = (1 << g.bits) - 1;
  const uint32_t k_word = reinterpret_cast<const uint32_t*>(block + g.k_codes(head, slot))[first_bit / 32];
  const uint32_t v_word = reinterpret_cast<const uint32_t*>(block + g.v_codes(head, slot))[first_bit / 32];
  const uint16_t* k_scale = scales_at(block, g.k_scale(head));
  const uint16_t* k_min = scales_at(block, g.k_min(head));
  const int group = lane * C / kKvQuantGroup;
  const float v_scale = load_scale(scales_at(block, g.v_scale(head, slot))[group]);
  const float v_min = load_scale(scales_at(block, g.v_min(head, slot))[group]);
#pragma unroll
  for (int j = 0; j < C; ++j) {
    const int c = lane * C + j, shift = first_bit % 32 + j * g.bits;
    k[j] = dequantize_code(int((k_word >> shift) & mask), load_scale(k_scale[c]), load_scale(k_min[c]));
    v[j] = dequantize_code(int((v_word >> shift) & mask), v_scale, v_min);
  }
}

__device__ inline float warp_max(float x) {
  for (int offset = 16; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

// N online-softmax states before the first entry: running max -inf, sum 0, output 0 (C channels each).
template <int N, int C>
__device__ inline void reset_softmax(float (&m)[N], float (&l)[N], float (&o)[N][C]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
#pragma unroll
    for (int j = 0; j < C; ++j) o[i][j] = 0.0f;
  }
}

// ---- Kernels -----------------------------------------------------------------------------------------------

// Block (i): token rows[i] of k and v (all KV heads, [Hkv * D]) into slot slots[i] of the block at offsets[i].
// Thread c covers element c of the row: KV head c / D, channel c % D. A thread per element up to 1024 (at 128
// threads, the 8 loops of a 1,024-wide row took 9.5 us on an H200 in batch-1 decode).
__global__ void kv_write_kernel(const float* k, const float* v, const int32_t* rows, const int32_t* slots,
                                const int64_t* offsets, uint8_t* pool, KvGeometry g) {
  allow_dependents();
  wait_for_inputs();
  const int width = g.n_kv_heads * g.head_dim;
  const float* k_row = k + int64_t(rows[blockIdx.x]) * width;
  const float* v_row = v + int64_t(rows[blockIdx.x]) * width;
  const int slot = slots[blockIdx.x];
  for (int c = threadIdx.x; c < width; c += blockDim.x) {
    const int head = c / g.head_dim, ch = c % g.head_dim;
    store_bf16(pool, offsets[blockIdx.x], g.k_element(head, slot) + ch, k_row[c]);
    store_bf16(pool, offsets[blockIdx.x], g.v_element(head, slot) + ch, v_row[c]);
  }
}

// The work of decode block (split blockIdx.x, KV head blockIdx.y, head chunk blockIdx.z): its split, its sequence,
// and its query heads [head_begin, head_begin + n_group) of KV head kv_head (kMaxGroup a chunk).
struct DecodeBlock {
  DecodeItem item;
  SeqDesc s;
  int kv_head, head_begin, n_group;
};
__device__ inline DecodeBlock decode_block(const SeqDesc* seqs, const DecodeItem* items, int group) {
  const DecodeItem item = items[blockIdx.x];
  const int kv_head = blockIdx.y, chunk = int(blockIdx.z) * kMaxGroup;
  return DecodeBlock{item, seqs[item.seq], kv_head, kv_head * group + chunk, min(kMaxGroup, group - chunk)};
}

// The end of both decode kernels: the block's warps' states merged into one partial (m, l, o) per query head of the
// block, written to part_m/part_l [item][h] and part_o [item][h][D] (o not yet divided by l). State (m_w, l_w, o_w)
// counts with weight exp(m_w - M), M the largest m_w; a warp that saw no entry (a split shorter than the warps'
// share) has m = -inf and weight 0. Lane j of a warp holds channels [j * C, j * C + C) of o.
template <int C>
__device__ void write_split_partials(const float (&m)[kMaxGroup], const float (&l)[kMaxGroup],
                                     const float (&o)[kMaxGroup][C], int n_group, int head_begin, int n_heads,
                                     float* part_m, float* part_l, float* part_o) {
  constexpr int D = 32 * C;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __shared__ float warp_m[kWarps][kMaxGroup], warp_l[kWarps][kMaxGroup];
  __shared__ float warp_o[kWarps][kMaxGroup][D];
#pragma unroll
  for (int gi = 0; gi < kMaxGroup; ++gi) {
    if (lane == 0) {
      warp_m[warp][gi] = m[gi];
      warp_l[warp][gi] = l[gi];
    }
#pragma unroll
    for (int j = 0; j < C; ++j) warp_o[warp][gi][lane * C + j] = o[gi][j];
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < n_group * D; idx += blockDim.x) {
    const int gi = idx / D, c = idx % D;  // query head head_begin + gi, channel c
    float big_m = -INFINITY;
    for (int w = 0; w < kWarps; ++w) big_m = fmaxf(big_m, warp_m[w][gi]);
    float sum_l = 0.0f, sum_o = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      const float weight = warp_m[w][gi] == -INFINITY ? 0.0f : expf(warp_m[w][gi] - big_m);
      sum_l += warp_l[w][gi] * weight;
      sum_o += warp_o[w][gi][c] * weight;
    }
    const int64_t cell = int64_t(blockIdx.x) * n_heads + head_begin + gi;  // [item][h]
    part_o[cell * D + c] = sum_o;
    if (c == 0) {
      part_m[cell] = big_m;
      part_l[cell] = sum_l;
    }
  }
}

// Block (split i, KV head, chunk z): the partial softmax state of each query head h = KV head * group + z *
// kMaxGroup + gi (gi < kMaxGroup, h within the KV head's group) over the split's entries, written to part_m/part_l
// [item][h] and part_o [item][h][D] (o not yet divided by l).
template <int C>
__global__ void __launch_bounds__(kThreads, kDecodeBlocksPerSm<C>)
    decode_kernel(const float* q, const SeqDesc* seqs, const DecodeItem* items, const int64_t* blocks,
                  const uint8_t* pool, KvGeometry g, KeyRopeTable rope, int n_heads, int group, float scale,
                  float* part_m, float* part_l, float* part_o) {
  allow_dependents();
  wait_for_inputs();
  constexpr int D = 32 * C;
  const auto [item, s, kv_head, head_begin, n_group] = decode_block(seqs, items, group);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  // This block's query heads, pre-scaled, this lane's channels.
  float qr[kMaxGroup][C];
  const float* q_row = q + int64_t(s.q_begin) * n_heads * D;
#pragma unroll
  for (int gi = 0; gi < kMaxGroup; ++gi) {
#pragma unroll
    for (int j = 0; j < C; ++j) qr[gi][j] = gi < n_group ? q_row[(head_begin + gi) * D + lane * C + j] * scale : 0.0f;
  }

  float m[kMaxGroup], l[kMaxGroup], o[kMaxGroup][C];
  reset_softmax(m, l, o);

  for (int e = item.key_begin + warp; e < item.key_end; e += kWarps) {
    const int64_t blk = blocks[s.table_begin + e / g.block_size];
    float k[C], v[C];
    read_entry<C>(pool, blk, g, rope, kv_head, e % g.block_size, lane, k, v);
#pragma unroll
    for (int gi = 0; gi < kMaxGroup; ++gi) {
      if (gi >= n_group) break;
      float partial = 0.0f;
#pragma unroll
      for (int j = 0; j < C; ++j) partial += qr[gi][j] * k[j];
      const float score = warp_sum(partial);
      const float m_new = fmaxf(m[gi], score);
      const float correction = expf(m[gi] - m_new);  // 0 for the first entry (m = -inf)
      const float p = expf(score - m_new);
      l[gi] = l[gi] * correction + p;
#pragma unroll
      for (int j = 0; j < C; ++j) o[gi][j] = o[gi][j] * correction + p * v[j];
      m[gi] = m_new;
    }
  }

  write_split_partials<C>(m, l, o, n_group, head_begin, n_heads, part_m, part_l, part_o);
}

// Block (split i, KV head, chunk z) as decode_kernel's, over full-precision (bf16) blocks only: warp w takes every
// kWarps-th tile of 32 entries of the split, lane j the tile's entry j. The lane scores its entry's key against
// the block's query heads (pre-scaled in shared memory, read as broadcasts) in 16-byte loads of the key row; the
// warp takes each query head's tile maximum and sum in one reduction; then its lanes, over channels as in
// decode_kernel, add the tile's 32 values weighted by the probabilities, passed by shuffles. A warp has a whole
// tile's loads in flight where decode_kernel has one entry's, and reduces once per tile where decode_kernel
// reduces once per entry (decode_kernel read a batch of 64's KV at 0.88 TB/s on an H200). Long: one tile loop whose
// phases share the lanes' scores, probabilities and softmax states in registers.
template <int C>
__global__ void __launch_bounds__(kThreads, 4)
    decode_tiled_kernel(const float* q, const SeqDesc* seqs, const DecodeItem* items, const int64_t* blocks,
                        const uint8_t* pool, KvGeometry g, int n_heads, int group, float scale, float* part_m,
                        float* part_l, float* part_o) {
  allow_dependents();
  wait_for_inputs();
  constexpr int D = 32 * C;
  const auto [item, s, kv_head, head_begin, n_group] = decode_block(seqs, items, group);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  __shared__ float4 q_shared[kMaxGroup][D / 4];
  const float* q_row = q + int64_t(s.q_begin) * n_heads * D;
  for (int idx = threadIdx.x; idx < kMaxGroup * D; idx += blockDim.x) {
    const int gi = idx / D, c = idx % D;
    reinterpret_cast<float*>(q_shared[gi])[c] = gi < n_group ? q_row[(head_begin + gi) * D + c] * scale : 0.0f;
  }
  __syncthreads();

  float m[kMaxGroup], l[kMaxGroup], o[kMaxGroup][C];
  reset_softmax(m, l, o);
  for (int t0 = item.key_begin + 32 * warp; t0 < item.key_end; t0 += 32 * kWarps) {
    const int e = t0 + lane;
    const bool valid = e < item.key_end;
    // This lane's entry: its key row's and value row's element offsets in the pool (bf16 elements from the base).
    int64_t k_at = 0, v_at = 0;
    if (valid) {
      const int64_t blk = blocks[s.table_begin + e / g.block_size] / 2;  // full-precision: a byte offset, even
      k_at = blk + g.k_element(kv_head, e % g.block_size);
      v_at = blk + g.v_element(kv_head, e % g.block_size);
    }
    float score[kMaxGroup];
#pragma unroll
    for (int gi = 0; gi < kMaxGroup; ++gi) score[gi] = 0.0f;
    if (valid) {
      const auto* k_row = reinterpret_cast<const uint4*>(reinterpret_cast<const __nv_bfloat16*>(pool) + k_at);
#pragma unroll 4
      for (int c8 = 0; c8 < D / 8; ++c8) {
        const uint4 packed = k_row[c8];
        const auto* pairs = reinterpret_cast<const __nv_bfloat162*>(&packed);
        const float2 k01 = __bfloat1622float2(pairs[0]), k23 = __bfloat1622float2(pairs[1]);
        const float2 k45 = __bfloat1622float2(pairs[2]), k67 = __bfloat1622float2(pairs[3]);
#pragma unroll
        for (int gi = 0; gi < kMaxGroup; ++gi) {
          if (gi >= n_group) break;
          const float4 a = q_shared[gi][2 * c8], b = q_shared[gi][2 * c8 + 1];
          score[gi] += a.x * k01.x + a.y * k01.y + a.z * k23.x + a.w * k23.y + b.x * k45.x + b.y * k45.y +
                       b.z * k67.x + b.w * k67.y;
        }
      }
    }
    float p[kMaxGroup];
#pragma unroll
    for (int gi = 0; gi < kMaxGroup; ++gi) {
      p[gi] = 0.0f;
      if (gi >= n_group) continue;
      const float m_new = fmaxf(m[gi], warp_max(valid ? score[gi] : -INFINITY));  // finite: lane 0's entry is valid
      const float correction = expf(m[gi] - m_new);                                // 0 for the first tile
      p[gi] = valid ? expf(score[gi] - m_new) : 0.0f;
      l[gi] = l[gi] * correction + warp_sum(p[gi]);
      m[gi] = m_new;
#pragma unroll
      for (int j = 0; j < C; ++j) o[gi][j] *= correction;
    }
    // The tile's values, entry by entry (the loop bound is the same in every lane), the lanes over channels.
    const int n_entries = min(32, item.key_end - t0);
#pragma unroll 8
    for (int jj = 0; jj < n_entries; ++jj) {
      const int64_t at = __shfl_sync(0xffffffffu, v_at, jj);
      const auto* vp = reinterpret_cast<const __nv_bfloat162*>(reinterpret_cast<const __nv_bfloat16*>(pool) + at +
                                                                lane * C);
      float v[C];
#pragma unroll
      for (int j = 0; j < C / 2; ++j) {
        const float2 vf = __bfloat1622float2(vp[j]);
        v[2 * j] = vf.x;
        v[2 * j + 1] = vf.y;
      }
#pragma unroll
      for (int gi = 0; gi < kMaxGroup; ++gi) {
        if (gi >= n_group) break;
        const float pj = __shfl_sync(0xffffffffu, p[gi], jj);
#pragma unroll
        for (int j = 0; j < C; ++j) o[gi][j] += pj * v[j];
      }
    }
  }
  write_split_partials<C>(m, l, o, n_group, head_begin, n_heads, part_m, part_l, part_o);
}

// Block (decode sequence, query head h), thread c: merges the sequence's splits as the warps were merged above,
// writes out = o / l and the row's final (m, l) to row_m/row_l [row][h].
__global__ void decode_combine_kernel(const SeqDesc* seqs, const DecodeSeq* dseqs, const float* part_m,
                                      const float* part_l, const float* part_o, int n_heads, int head_dim,
                                      float* out, float* row_m, float* row_l) {
  allow_dependents();
  wait_for_inputs();
  const DecodeSeq ds = dseqs[blockIdx.x];
  const int h = blockIdx.y, c = threadIdx.x;
  float big_m = -INFINITY;
  for (int i = 0; i < ds.n_items; ++i) big_m = fmaxf(big_m, part_m[int64_t(ds.first_item + i) * n_heads + h]);
  float sum_l = 0.0f, sum_o = 0.0f;
  for (int i = 0; i < ds.n_items; ++i) {
    const int64_t cell = int64_t(ds.first_item + i) * n_heads + h;
    const float weight = part_m[cell] == -INFINITY ? 0.0f : expf(part_m[cell] - big_m);
    sum_l += part_l[cell] * weight;
    sum_o += part_o[cell * head_dim + c] * weight;
  }
  const int row = seqs[ds.seq].q_begin;
  out[(int64_t(row) * n_heads + h) * head_dim + c] = sum_o / sum_l;
  if (c == 0) {
    row_m[int64_t(row) * n_heads + h] = big_m;
    row_l[int64_t(row) * n_heads + h] = sum_l;
  }
}

// Shared memory of prefill_kernel, in floats: Q [kTileRows][D], K [kTileKeys][D + 1] (padded: lane j reads row j,
// and the odd stride puts the 32 lanes on 32 banks), V [kTileKeys][D], P [kTileRows][kTileKeys].
constexpr size_t prefill_shared_bytes(int d) {
  return sizeof(float) * (size_t(kTileRows) * d + size_t(kTileKeys) * (d + 1) + size_t(kTileKeys) * d +
                          size_t(kTileRows) * kTileKeys);
}

// Block (tile, query head h): rows [begin, begin + kTileRows) of one sequence (row i attends to entries
// [0, n_ctx_before + i]), written to out and their final (m, l) to row_m/row_l.
// Long: one flash-attention tile loop; its phases share the shared-memory tiles, the per-row softmax state in
// registers and the barriers between them, which device functions would only pass around.
template <int C>
__global__ void __launch_bounds__(kThreads) prefill_kernel(const float* q, const SeqDesc* seqs, const TileItem* tiles,
                                                           const int64_t* blocks, const uint8_t* pool, KvGeometry g,
                                                           KeyRopeTable rope, int n_heads, int group, float scale,
                                                           float* out, float* row_m, float* row_l) {
  constexpr int D = 32 * C;
  extern __shared__ float shared[];
  float* q_tile = shared;                                  // [kTileRows][D]
  float* k_tile = q_tile + kTileRows * D;                  // [kTileKeys][D + 1]
  float* v_tile = k_tile + kTileKeys * (D + 1);            // [kTileKeys][D]
  float* p_tile = v_tile + kTileKeys * D;                  // [kTileRows][kTileKeys]

  const TileItem tile = tiles[blockIdx.x];
  const SeqDesc s = seqs[tile.seq];
  const int h = blockIdx.y, kv_head = h / group;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n_rows = min(kTileRows, s.n_q - tile.begin);
  // Entries any row of the tile sees: up to the last row's n_ctx_before + i.
  const int n_keys = s.n_ctx_before + tile.begin + n_rows;

  for (int idx = threadIdx.x; idx < kTileRows * D; idx += blockDim.x) {
    const int r = idx / D, c = idx % D;
    q_tile[idx] =
        r < n_rows ? q[(int64_t(s.q_begin + tile.begin + r) * n_heads + h) * D + c] * scale : 0.0f;
  }

  // Row r = warp + kWarps * i of the tile: its state.
  float m[kRowsPerWarp], l[kRowsPerWarp], o[kRowsPerWarp][C];
  reset_softmax(m, l, o);

  for (int key0 = 0; key0 < n_keys; key0 += kTileKeys) {
    __syncthreads();  // the previous tile's K, V are no longer read (and, the first time, q_tile is complete)
    for (int idx = threadIdx.x; idx < kTileKeys * D; idx += blockDim.x) {
      const int kk = idx / D, c = idx % D, e = key0 + kk;
      float kx = 0.0f, vx = 0.0f;
      if (e < n_keys) {
        const int64_t blk = blocks[s.table_begin + e / g.block_size];
        kx = read_key<D>(pool, blk, g, rope, kv_head, e % g.block_size, c);
        vx = read_value<D>(pool, blk, g, kv_head, e % g.block_size, c);
      }
      k_tile[kk * (D + 1) + c] = kx;
      v_tile[kk * D + c] = vx;
    }
    __syncthreads();

    // Scores of key key0 + lane for the warp's rows, 32 channels at a time (the lane's key chunk in registers).
    float score[kRowsPerWarp];
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) score[i] = 0.0f;
    for (int c0 = 0; c0 < D; c0 += 32) {
      float kr[32];
#pragma unroll
      for (int cc = 0; cc < 32; ++cc) kr[cc] = k_tile[lane * (D + 1) + c0 + cc];
#pragma unroll
      for (int i = 0; i < kRowsPerWarp; ++i) {
        const float* qr = q_tile + (warp + kWarps * i) * D + c0;  // the same address in every lane: a broadcast
#pragma unroll
        for (int cc = 0; cc < 32; ++cc) score[i] += qr[cc] * kr[cc];
      }
    }

    // Online softmax per row; p of masked entries (after the row's last entry, or past the tile's keys) is 0.
    const int e = key0 + lane;
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      const int r = warp + kWarps * i;
      const bool visible = r < n_rows && e <= s.n_ctx_before + tile.begin + r;
      const float tile_max = warp_max(visible ? score[i] : -INFINITY);
      const float m_new = fmaxf(m[i], tile_max);
      // A row of the tile that sees nothing here keeps its state: m_new = m, correction 1, p 0. A padding row
      // (r >= n_rows) sees nothing anywhere and stays at m = -inf; its results are never written.
      const float correction = m_new == -INFINITY ? 1.0f : expf(m[i] - m_new);
      const float p = visible ? expf(score[i] - m_new) : 0.0f;
      l[i] = l[i] * correction + warp_sum(p);
      m[i] = m_new;
      p_tile[r * kTileKeys + lane] = p;
#pragma unroll
      for (int j = 0; j < C; ++j) o[i][j] *= correction;
    }
    __syncwarp();
    // o[row][lane + 32 j] += sum over the tile's keys of p[row][key] * v[key][lane + 32 j].
    for (int kk = 0; kk < kTileKeys; ++kk) {
      float vr[C];
#pragma unroll
      for (int j = 0; j < C; ++j) vr[j] = v_tile[kk * D + lane + 32 * j];
#pragma unroll
      for (int i = 0; i < kRowsPerWarp; ++i) {
        const float p = p_tile[(warp + kWarps * i) * kTileKeys + kk];
#pragma unroll
        for (int j = 0; j < C; ++j) o[i][j] += p * vr[j];
      }
    }
    __syncwarp();  // p_tile rows are rewritten by the next tile
  }

#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int r = warp + kWarps * i;
    if (r >= n_rows) continue;
    const int64_t row = s.q_begin + tile.begin + r;
#pragma unroll
    for (int j = 0; j < C; ++j) out[(row * n_heads + h) * D + lane + 32 * j] = o[i][j] / l[i];
    if (lane == 0) {
      row_m[row * n_heads + h] = m[i];
      row_l[row * n_heads + h] = l[i];
    }
  }
}

// Block (entry tile, query head h) of one sequence: sums[h][e] = sum over the stats rows i (i >= stats_row_begin,
// e <= n_ctx_before + i) of exp(s_ie - m_i) / l_i, for the tile's entries e = begin + lane. Warp w takes rows
// first + w, first + w + kWarps, ...; the warps' sums are added in shared memory at the end. sums has n_keys
// entries per head (n_keys = n_ctx_before + n_q).
template <int C>
__global__ void __launch_bounds__(kThreads) column_sums_kernel(const float* q, const SeqDesc* seqs,
                                                               const TileItem* tiles, const int64_t* sums_offset,
                                                               const int32_t* stats_row_begin, const int64_t* blocks,
                                                               const uint8_t* pool, KvGeometry g,
                                                               KeyRopeTable rope, int n_heads, int group,
                                                               float scale, const float* row_m, const float* row_l,
                                                               float* sums) {
  constexpr int D = 32 * C;
  __shared__ float k_tile[kTileKeys][D + 1];  // padded as in prefill_kernel
  __shared__ float q_rows[kWarps][D];
  __shared__ float warp_sums[kWarps][kTileKeys];
  const TileItem tile = tiles[blockIdx.x];
  const SeqDesc s = seqs[tile.seq];
  const int h = blockIdx.y, kv_head = h / group;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n_keys = s.n_ctx_before + s.n_q;

  for (int idx = threadIdx.x; idx < kTileKeys * D; idx += blockDim.x) {
    const int kk = idx / D, c = idx % D, e = tile.begin + kk;
    k_tile[kk][c] = e < n_keys ? read_key<D>(pool, blocks[s.table_begin + e / g.block_size], g, rope, kv_head,
                                          e % g.block_size, c)
                               : 0.0f;
  }
  __syncthreads();

  const int e = tile.begin + lane;
  // The first row that sees any entry of the tile: n_ctx_before + i >= begin.
  const int first = max(stats_row_begin[tile.seq], tile.begin - s.n_ctx_before);
  float acc = 0.0f;
  for (int i = first + warp; i < s.n_q; i += kWarps) {
    const int64_t row = s.q_begin + i;
    for (int c = lane; c < D; c += 32) q_rows[warp][c] = q[(row * n_heads + h) * D + c] * scale;
    __syncwarp();
    float score = 0.0f;
    for (int c = 0; c < D; ++c) score += q_rows[warp][c] * k_tile[lane][c];
    if (e < n_keys && e <= s.n_ctx_before + i) {
      acc += expf(score - row_m[row * n_heads + h]) / row_l[row * n_heads + h];
    }
    __syncwarp();  // q_rows[warp] is rewritten for the next row
  }
  warp_sums[warp][lane] = acc;
  __syncthreads();
  if (warp == 0 && e < n_keys) {
    float total = 0.0f;
    for (int w = 0; w < kWarps; ++w) total += warp_sums[w][lane];
    sums[sums_offset[tile.seq] + int64_t(h) * n_keys + e] = total;
  }
}

// ---- Host side ---------------------------------------------------------------------------------------------

void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("cuda backend: " + what);
}

// Calls f(std::integral_constant<int, C>) for the head_dims the attention kernels are built for.
template <class F>
void with_channels(int head_dim, const char* op, F f) {
  switch (head_dim) {
    case 64: f(std::integral_constant<int, 2>{}); break;
    case 128: f(std::integral_constant<int, 4>{}); break;
    default:
      throw std::invalid_argument(std::string("cuda backend: ") + op + ": head_dim " + std::to_string(head_dim) +
                                  " is not supported (64 or 128)");
  }
}

// The encoded block offsets of every sequence's table, up to the blocks its entries [0, n_ctx_before + n_q)
// use; fills table_begin of each SeqDesc.
std::vector<int64_t> resolve_tables(std::span<const AttentionSequence> seqs, const KvPoolView& pool,
                                    std::vector<SeqDesc>& descs, const char* op) {
  const KvBlockLayout& L = pool.layout;
  std::vector<int64_t> blocks;
  for (const AttentionSequence& s : seqs) {
    const int64_t n_keys = int64_t(s.n_ctx_before) + s.n_q;
    const int64_t n_blocks = (n_keys + L.block_size - 1) / L.block_size;
    require(s.q_begin >= 0 && s.n_q >= 0 && s.n_ctx_before >= 0,
            std::string(op) + ": a sequence has a negative q_begin, n_q or n_ctx_before");
    require(int64_t(s.block_table.size()) >= n_blocks,
            std::string(op) + ": a sequence with " + std::to_string(n_keys) + " entries has a block table of " +
                std::to_string(s.block_table.size()) + " blocks");
    descs.push_back(SeqDesc{s.q_begin, s.n_q, s.n_ctx_before, int32_t(blocks.size())});
    for (int64_t j = 0; j < n_blocks; ++j) {
      const int32_t id = s.block_table[size_t(j)];
      if (pool.is_coded(id)) {
        require(pool.key_rope.table != nullptr && pool.key_rope.n_positions > 0,
                std::string(op) + ": block " + std::to_string(id) +
                    " is a coded block, and the pool view has no key RoPE table to rotate its keys with");
        blocks.push_back(~coded_block_offset(pool, id, op));
      } else if (pool.is_quantized(id)) {
        require_quantized_pool(pool, op);
        blocks.push_back(~quantized_block_offset(pool, id, op));
      } else {
        blocks.push_back(full_block_offset(pool, id, op));
      }
    }
  }
  return blocks;
}

// The work lists of one call: decode splits, prefill row tiles, column-sum entry tiles, and where each sequence's
// column sums go in the device buffer.
struct AttentionWork {
  std::vector<DecodeItem> decode_items;
  std::vector<DecodeSeq> decode_seqs;
  std::vector<TileItem> prefill_tiles, sum_tiles;
  std::vector<int64_t> sums_offset;  // per sequence, in floats
  std::vector<int32_t> stats_begin;  // per sequence: its first row that adds to the column sums
  int64_t sums_floats = 0;
};

AttentionWork attention_work(const CudaContext& ctx, std::span<const AttentionSequence> seqs, int n_kv_heads,
                             int n_heads, int head_chunks, int min_split_keys) {
  AttentionWork w;
  w.sums_offset.assign(seqs.size(), 0);
  w.stats_begin.assign(seqs.size(), 0);
  int n_decode = 0;
  for (const AttentionSequence& s : seqs) n_decode += s.n_q == 1;
  // Enough splits for a few blocks per multiprocessor over the whole call, never under min_split_keys entries.
  const int target_blocks = 4 * ctx.multiprocessors();
  const int splits_wanted = std::max(1, target_blocks / std::max(1, n_decode * n_kv_heads * head_chunks));
  for (size_t i = 0; i < seqs.size(); ++i) {
    const AttentionSequence& s = seqs[i];
    const int n_keys = s.n_ctx_before + s.n_q;
    if (s.n_q == 1) {
      const int splits = std::clamp((n_keys + min_split_keys - 1) / min_split_keys, 1, splits_wanted);
      const int chunk = (n_keys + splits - 1) / splits;
      w.decode_seqs.push_back(DecodeSeq{int32_t(i), int32_t(w.decode_items.size()), 0, 0});
      for (int b = 0; b < n_keys; b += chunk) {
        w.decode_items.push_back(DecodeItem{int32_t(i), b, std::min(n_keys, b + chunk), 0});
      }
      w.decode_seqs.back().n_items = int32_t(w.decode_items.size()) - w.decode_seqs.back().first_item;
    } else {
      for (int r = 0; r < s.n_q; r += kTileRows) w.prefill_tiles.push_back(TileItem{int32_t(i), r});
    }
    require(!s.column_maxima, "paged_attention: no column maxima on CUDA (Backend::has_column_maxima)");
    if (s.column_sums != nullptr && s.stats_row_begin < s.n_q) {
      require(s.sums_stride >= n_keys, "paged_attention: column_sums stride " + std::to_string(s.sums_stride) +
                                           " is below the sequence's " + std::to_string(n_keys) + " entries");
      w.sums_offset[i] = w.sums_floats;
      w.stats_begin[i] = std::max(0, s.stats_row_begin);
      w.sums_floats += int64_t(n_heads) * n_keys;
      for (int e = 0; e < n_keys; e += kTileKeys) w.sum_tiles.push_back(TileItem{int32_t(i), e});
    }
  }
  return w;
}

// Adds the column sums computed on the device (sums, downloaded) to the sequences' host statistics.
void add_column_sums(std::span<const AttentionSequence> seqs, const std::vector<float>& sums,
                     const std::vector<int64_t>& sums_offset, int n_heads) {
  for (size_t i = 0; i < seqs.size(); ++i) {
    const AttentionSequence& s = seqs[i];
    if (s.column_sums == nullptr || s.stats_row_begin >= s.n_q) continue;
    const int n_keys = s.n_ctx_before + s.n_q;
    for (int h = 0; h < n_heads; ++h) {
      const float* src = sums.data() + sums_offset[i] + int64_t(h) * n_keys;
      float* dst = s.column_sums + int64_t(h) * s.sums_stride;
      for (int e = 0; e < n_keys; ++e) dst[e] += src[e];
    }
  }
}

}  // namespace

void kv_write(CudaContext& ctx, const Tensor& k, const Tensor& v, std::span<const AttentionSequence> seqs,
              const KvPoolView& pool) {
  require_bf16_pool(pool, "kv_write");
  const KvBlockLayout& L = pool.layout;
  const int64_t width = int64_t(L.n_kv_heads) * L.head_dim;
  require(k.dtype == DType::f32 && v.dtype == DType::f32 && k.cols == width && v.cols == width &&
              v.rows == k.rows,
          "kv_write: k and v must be f32 [T, " + std::to_string(width) + "]");
  std::vector<int32_t> rows, slots;
  std::vector<int64_t> offsets;
  for (const AttentionSequence& s : seqs) {
    require(s.q_begin >= 0 && int64_t(s.q_begin) + s.n_q <= k.rows,
            "kv_write: rows [" + std::to_string(s.q_begin) + ", " + std::to_string(s.q_begin + s.n_q) +
                ") are outside k's " + std::to_string(k.rows));
    for (int i = 0; i < s.n_q; ++i) {
      const int entry = s.n_ctx_before + i;
      const size_t b = size_t(entry / L.block_size);
      require(b < s.block_table.size(), "kv_write: entry " + std::to_string(entry) + " is past the block table");
      rows.push_back(s.q_begin + i);
      slots.push_back(entry % L.block_size);
      offsets.push_back(full_block_offset(pool, s.block_table[b], "kv_write"));
    }
  }
  if (rows.empty()) return;
  const std::vector<const void*> up = ctx.upload_together(
      {CudaContext::bytes_of(rows), CudaContext::bytes_of(slots), CudaContext::bytes_of(offsets)});
  const int threads = int(std::min<int64_t>(1024, (width + 31) / 32 * 32));
  launch_overlapped(ctx, "kv_write_kernel", kv_write_kernel, unsigned(rows.size()), threads, 0, k.f32(), v.f32(),
                    static_cast<const int32_t*>(up[0]), static_cast<const int32_t*>(up[1]),
                    static_cast<const int64_t*>(up[2]), static_cast<uint8_t*>(pool.base), geometry_of(L));
}

// Long: one upload of every array the call's kernels read, then the launches of its three phases (decode splits,
// prefill tiles, column sums), which share those arrays and the rows' (m, l).
void paged_attention(CudaContext& ctx, const Tensor& q, std::span<const AttentionSequence> seqs,
                     const KvPoolView& pool, int n_heads, float scale, Tensor& out) {
  require_bf16_pool(pool, "paged_attention");
  const KvBlockLayout& L = pool.layout;
  const int hd = L.head_dim;
  require(L.n_kv_heads > 0 && n_heads % L.n_kv_heads == 0,
          "paged_attention: " + std::to_string(n_heads) + " query heads do not share " +
              std::to_string(L.n_kv_heads) + " KV heads evenly");
  const int group = n_heads / L.n_kv_heads;
  const int head_chunks = (group + kMaxGroup - 1) / kMaxGroup;  // decode blocks per (split, KV head)
  const int64_t width = int64_t(n_heads) * hd;
  require(q.dtype == DType::f32 && out.dtype == DType::f32 && q.cols == width && out.cols == width,
          "paged_attention: q and out must be f32 [T, " + std::to_string(width) + "]");
  int64_t n_rows = 0;
  for (const AttentionSequence& s : seqs) n_rows = std::max(n_rows, int64_t(s.q_begin) + s.n_q);
  require(n_rows <= q.rows && n_rows <= out.rows, "paged_attention: the sequences' rows go past q or out");

  std::vector<SeqDesc> descs;
  const std::vector<int64_t> blocks = resolve_tables(seqs, pool, descs, "paged_attention");

  // Decode splits go to decode_tiled_kernel where every block of the call is a full-precision one, to decode_kernel
  // where some are quantized or coded.
  const bool tiled = std::none_of(blocks.begin(), blocks.end(), [](int64_t b) { return b < 0; });
  const AttentionWork work =
      attention_work(ctx, seqs, L.n_kv_heads, n_heads, head_chunks, tiled ? kMinTiledSplitKeys : kMinSplitKeys);
  const std::vector<DecodeItem>& decode_items = work.decode_items;
  const std::vector<DecodeSeq>& decode_seqs = work.decode_seqs;
  const std::vector<TileItem>& prefill_tiles = work.prefill_tiles;
  const std::vector<TileItem>& sum_tiles = work.sum_tiles;
  const int64_t sums_floats = work.sums_floats;
  if (n_rows == 0) return;

  // Every array the kernels read, in one copy.
  using Ctx = CudaContext;
  const std::vector<const void*> up = ctx.upload_together(
      {Ctx::bytes_of(descs), Ctx::bytes_of(blocks), Ctx::bytes_of(decode_items), Ctx::bytes_of(decode_seqs),
       Ctx::bytes_of(prefill_tiles), Ctx::bytes_of(sum_tiles), Ctx::bytes_of(work.sums_offset),
       Ctx::bytes_of(work.stats_begin)});
  const auto* descs_d = static_cast<const SeqDesc*>(up[0]);
  const auto* blocks_d = static_cast<const int64_t*>(up[1]);
  const uint8_t* pool_d = static_cast<const uint8_t*>(pool.base);
  const KvGeometry geo = geometry_of(L);
  const KeyRopeTable rope = key_rope_of(pool);
  auto* row_m = static_cast<float*>(ctx.scratch(size_t(n_rows * n_heads) * sizeof(float)));
  auto* row_l = static_cast<float*>(ctx.scratch(size_t(n_rows * n_heads) * sizeof(float)));

  with_channels(hd, "paged_attention", [&](auto channels) {
    constexpr int C = decltype(channels)::value;
    if (!decode_items.empty()) {
      const size_t cells = decode_items.size() * size_t(n_heads);
      auto* part_m = static_cast<float*>(ctx.scratch(cells * sizeof(float)));
      auto* part_l = static_cast<float*>(ctx.scratch(cells * sizeof(float)));
      auto* part_o = static_cast<float*>(ctx.scratch(cells * hd * sizeof(float)));
      const dim3 grid(unsigned(decode_items.size()), unsigned(L.n_kv_heads), unsigned(head_chunks));
      if (tiled) {
        launch_overlapped(ctx, "decode_tiled_kernel", decode_tiled_kernel<C>, grid, kThreads, 0, q.f32(), descs_d,
                          static_cast<const DecodeItem*>(up[2]), blocks_d, pool_d, geo, n_heads, group, scale,
                          part_m, part_l, part_o);
      } else {
        launch_overlapped(ctx, "decode_kernel", decode_kernel<C>, grid, kThreads, 0, q.f32(), descs_d,
                          static_cast<const DecodeItem*>(up[2]), blocks_d, pool_d, geo, rope, n_heads, group, scale,
                          part_m, part_l, part_o);
      }
      launch_overlapped(ctx, "decode_combine_kernel", decode_combine_kernel,
                        dim3(unsigned(decode_seqs.size()), unsigned(n_heads)), hd, 0, descs_d,
                        static_cast<const DecodeSeq*>(up[3]), part_m, part_l, part_o, n_heads, hd, out.f32(), row_m,
                        row_l);
    }
    if (!prefill_tiles.empty()) {
      const size_t shared = prefill_shared_bytes(32 * C);
      check(cudaFuncSetAttribute(prefill_kernel<C>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared)),
            "cudaFuncSetAttribute (prefill_kernel)");
      prefill_kernel<C><<<dim3(unsigned(prefill_tiles.size()), unsigned(n_heads)), kThreads, shared, ctx.stream()>>>(
          q.f32(), descs_d, static_cast<const TileItem*>(up[4]), blocks_d, pool_d, geo, rope, n_heads, group,
          scale, out.f32(), row_m, row_l);
      check_launch("prefill_kernel");
    }
    if (!sum_tiles.empty()) {
      auto* sums_d = static_cast<float*>(ctx.scratch(size_t(sums_floats) * sizeof(float)));
      column_sums_kernel<C><<<dim3(unsigned(sum_tiles.size()), unsigned(n_heads)), kThreads, 0, ctx.stream()>>>(
          q.f32(), descs_d, static_cast<const TileItem*>(up[5]), static_cast<const int64_t*>(up[6]),
          static_cast<const int32_t*>(up[7]), blocks_d, pool_d, geo, rope, n_heads, group, scale, row_m, row_l, sums_d);
      check_launch("column_sums_kernel");
      // The statistics are host memory: wait for them here (only in steps that collect statistics).
      std::vector<float> sums(static_cast<size_t>(sums_floats), 0.0f);
      ctx.download(sums_d, sums.data(), sums.size() * sizeof(float));
      add_column_sums(seqs, sums, work.sums_offset, n_heads);
    }
  });
}

}  // namespace strata::cuda
