// SpindleKV's codebook ops on CUDA (kernels/kv_codebook.h; the CPU twin is kernels/cpu/kv_codebook.cpp): the
// greedy build of a codebook over one KV head's entries (kv_codebook_build), the best codebook vector of new
// entries (kv_codebook_match) and the coded form written into the pool (kv_codebook_encode). Entries are read from
// bf16 full-precision blocks; unit vectors, codebook vectors and magnitudes are fp32.
//
// The results are the CPU's, bit for bit: every quantity repeats the CPU's operations in the CPU's order with
// correctly rounded intrinsics and no fused multiply-adds (kv_device.cuh). A norm is the float of the square
// root of a double sum of squares in channel order, a cosine a float sum of products in channel order, each
// summed by one thread. So the build's adjacency equals the CPU's byte for byte, and so does its codebook.
//
// The build, over n entries:
//   1. the unit vectors (keys un-rotated to before RoPE), one warp per entry;
//   2. the adjacency G[a][b] = a == b || cos(a, b) > threshold, one byte per pair, rows padded to a multiple of
//      16 bytes; tiles of 64 x 64 pairs per thread block, n^2 x head_dim multiplies and adds like the CPU;
//   3. the degrees, one warp per row of G;
//   4. the greedy loop, in one thread block of 1024 threads. Thread t owns the columns of G in chunks of 16
//      (chunks t, t + 1024, ...): their alive bits and degrees are read and written by it alone, so only the
//      centre and the list of removed entries are shared. A step: the owners of the centre's alive neighbours
//      (the centre among them) assign them the step's code and append them to the list; after a barrier every
//      owner subtracts, for each removed b, row b of G over its columns (G is symmetric: dot(a, b) and dot(b, a)
//      are the same products summed in the same order, so row b is column b) and offers its best alive column;
//      a block reduction of (degree, lower index) names the next centre, the CPU's choice. Two barriers a step;
//      over the loop each row of G is read once as a removed entry and once more if it is a centre: O(n^2)
//      bytes, like the CPU's degree updates.
//   Scratch: n^2 bytes of adjacency (64 MiB for 8K entries) and n x head_dim floats of unit vectors.
//
// The match is one thread block per entry, a thread per codebook vector (|entries| x |codebook| x head_dim
// multiplies and adds). The encode writes the new codebook vectors first and then, in a second launch, the code
// rows and the write-back, so that new vectors are read from entries before any entry is overwritten, as on the
// CPU; it reads each entry once and writes 20 bytes of code row, and 2 x head_dim elements where it writes back.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/kv_device.cuh"

namespace strata::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kThreads = 32 * kWarpsPerBlock;
constexpr unsigned kFullWarp = 0xffffffffu;

// One entry's vector to read: the byte offset of its full-precision block, its slot there and its position.
struct EntryRef {
  int64_t block;
  int32_t slot;
  int32_t position;
};

// One entry to code: where it is, the byte offset of its code row and its codebook vector ids.
struct CodedEntry {
  EntryRef entry;
  int64_t row;
  int32_t k_vector;
  int32_t v_vector;
};

// ---- Entries as the CPU reads them -----------------------------------------------------------------------------

// Channel c of the entry's key un-rotated to before RoPE, or of its value: the CPU's read_entry().
__device__ inline float entry_channel(const uint8_t* pool, const EntryRef& e, int head, bool key, const KvGeometry& g,
                                      const KeyRopeTable& rope, int c) {
  if (!key) return load_bf16(pool, e.block, g.v_element(head, e.slot) + c);
  int a, b, i;
  rope_pair(rope, g.head_dim, c, a, b, i);
  const int64_t k = g.k_element(head, e.slot);
  return rope_channel(rope, g.head_dim, e.position, -1.0f, c, load_bf16(pool, e.block, k + a),
                      load_bf16(pool, e.block, k + b));
}

// The norm of x[0, n) as the CPU's normalise() takes it: a double sum of squares in channel order (so one
// thread), its square root rounded to float.
__device__ inline float norm_in_order(const float* x, int n) {
  double sq = 0.0;
  for (int i = 0; i < n; ++i) {
    const double v = x[i];
    sq = __dadd_rn(sq, __dmul_rn(v, v));
  }
  return __double2float_rn(__dsqrt_rn(sq));
}

// One warp: x[head_dim] (shared memory) := the entry's unit vector, a zero vector staying zero; every lane sees
// all of x on return.
__device__ void warp_unit_vector(const uint8_t* pool, const EntryRef& e, int head, bool key, const KvGeometry& g,
                                 const KeyRopeTable& rope, float* x, int lane) {
  for (int c = lane; c < g.head_dim; c += 32) x[c] = entry_channel(pool, e, head, key, g, rope, c);
  __syncwarp();
  const float norm = __shfl_sync(kFullWarp, lane == 0 ? norm_in_order(x, g.head_dim) : 0.0f, 0);
  if (norm > 0.0f) {
    for (int c = lane; c < g.head_dim; c += 32) x[c] = __fdiv_rn(x[c], norm);
  }
  __syncwarp();
}

// Grid ceil(n / kWarpsPerBlock), kThreads threads, kWarpsPerBlock x head_dim floats of shared memory: warp w of
// the grid writes the unit vector of entries[w] to dst + dst_offsets[w].
__global__ void unit_vectors(const uint8_t* pool, const EntryRef* entries, int n, int head, bool key, KvGeometry g,
                             KeyRopeTable rope, float* dst, const int64_t* dst_offsets) {
  extern __shared__ float staged[];
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int item = int(blockIdx.x) * kWarpsPerBlock + warp;
  if (item >= n) return;
  float* x = staged + warp * g.head_dim;
  warp_unit_vector(pool, entries[item], head, key, g, rope, x, lane);
  float* out = dst + dst_offsets[item];
  for (int c = lane; c < g.head_dim; c += 32) out[c] = x[c];
}

// ---- The build ---------------------------------------------------------------------------------------------------

constexpr int kTile = 64;          // entries per side of a tile of G
constexpr int kTileDepth = 32;     // channels per pass through shared memory
constexpr int kTileThreads = 256;  // 16 x 16 threads, 4 x 4 pairs each

// Grid (ceil(n / kTile), ceil(n / kTile)), kTileThreads threads: the tile of G at rows blockIdx.y * kTile and
// columns blockIdx.x * kTile; columns n <= b < pitch are written 0. Thread (tx, ty) sums the pairs
// (ty + 16 i, tx + 16 j), every product added in channel order; the channels pass through shared memory
// kTileDepth at a time (transposed, one column of padding against bank conflicts).
__global__ void __launch_bounds__(kTileThreads)
    adjacency(const float* unit, int n, int head_dim, float threshold, uint8_t* graph, int64_t pitch) {
  __shared__ float rows[kTileDepth][kTile + 1];
  __shared__ float cols[kTileDepth][kTile + 1];
  const int tx = int(threadIdx.x) % 16, ty = int(threadIdx.x) / 16;
  const int row0 = int(blockIdx.y) * kTile, col0 = int(blockIdx.x) * kTile;
  float dot[4][4] = {};
  for (int d0 = 0; d0 < head_dim; d0 += kTileDepth) {
    const int depth = min(kTileDepth, head_dim - d0);
    for (int i = int(threadIdx.x); i < kTile * kTileDepth; i += kTileThreads) {
      const int r = i / kTileDepth, d = i % kTileDepth;
      rows[d][r] = d < depth && row0 + r < n ? unit[int64_t(row0 + r) * head_dim + d0 + d] : 0.0f;
      cols[d][r] = d < depth && col0 + r < n ? unit[int64_t(col0 + r) * head_dim + d0 + d] : 0.0f;
    }
    __syncthreads();
    for (int d = 0; d < depth; ++d) {
      float x[4], y[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        x[i] = rows[d][ty + 16 * i];
        y[i] = cols[d][tx + 16 * i];
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) dot[i][j] = __fadd_rn(dot[i][j], __fmul_rn(x[i], y[j]));
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int a = row0 + ty + 16 * i, b = col0 + tx + 16 * j;
      if (a < n && b < pitch) graph[int64_t(a) * pitch + b] = b < n && (a == b || dot[i][j] > threshold);
    }
  }
}

// Grid ceil(pitch / kWarpsPerBlock), kThreads threads: warp w of the grid writes degree[w], the ones in row w of G
// (bytes 0 or 1, so a popcount), and 0 for the padding rows n <= w < pitch that the greedy loop's chunks cover.
__global__ void degrees(const uint8_t* graph, int64_t pitch, int n, int32_t* degree) {
  const int row = int(blockIdx.x) * kWarpsPerBlock + int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  if (row >= pitch) return;
  unsigned count = 0;
  if (row < n) {
    const auto* words = reinterpret_cast<const uint32_t*>(graph + int64_t(row) * pitch);
    for (int64_t w = lane; w < pitch / 4; w += 32) count += unsigned(__popc(words[w]));
  }
  count = __reduce_add_sync(kFullWarp, count);
  if (lane == 0) degree[row] = int32_t(count);
}

constexpr int kGreedyThreads = 1024;
constexpr int kGreedyWarps = kGreedyThreads / 32;
constexpr int kChunk = 16;           // columns of G per chunk: one uint4 of a row
constexpr int kMaxPackedRows = 255;  // rows of 0/1 bytes that packed byte counters can add without carrying

// The order in which the CPU picks a centre: the higher degree, then the lower index. 0 is below every entry.
using CentreKey = unsigned long long;
__device__ inline CentreKey centre_key(int32_t degree, int entry) {
  return CentreKey(uint32_t(degree)) << 32 | (0xffffffffu - uint32_t(entry));
}
__device__ inline int centre_of(CentreKey key) { return int(0xffffffffu - uint32_t(key)); }

__device__ inline CentreKey warp_max(CentreKey key) {
  for (int offset = 16; offset > 0; offset /= 2) {
    const CentreKey other = __shfl_xor_sync(kFullWarp, key, offset);
    key = other > key ? other : key;
  }
  return key;
}

// The largest key of the block, in every thread. One barrier; warp_best is written again only after the caller's
// next barrier, by which every thread has read it.
__device__ inline CentreKey block_max(CentreKey key, CentreKey* warp_best) {
  static_assert(kGreedyWarps == 32, "one warp reduces the warps' keys");
  key = warp_max(key);
  if (threadIdx.x % 32 == 0) warp_best[threadIdx.x / 32] = key;
  __syncthreads();
  return warp_max(warp_best[threadIdx.x % 32]);
}

// Bit j set where byte j of a chunk of G is 1 (bytes are 0 or 1: byte k's bit 8k lands on bit k).
__device__ inline uint32_t ones_of(uint4 w) {
  auto four = [](uint32_t x) { return (x | x >> 7 | x >> 14 | x >> 21) & 0xfu; };
  return four(w.x) | four(w.y) << 4 | four(w.z) << 8 | four(w.w) << 12;
}

// degree[kChunk * chunk + j] -= byte j of the packed counts.
__device__ inline void subtract_edges(int32_t* degree, int chunk, uint4 edges) {
  const uint32_t words[4] = {edges.x, edges.y, edges.z, edges.w};
  int32_t* d = degree + int64_t(chunk) * kChunk;
#pragma unroll
  for (int j = 0; j < kChunk; ++j) d[j] -= int32_t(words[j / 4] >> (8 * (j % 4)) & 0xffu);
}

// The best alive column of a chunk (alive: one bit per column).
__device__ inline CentreKey best_alive(const int32_t* degree, int chunk, uint32_t alive) {
  CentreKey best = 0;
  for (; alive != 0; alive &= alive - 1) {
    const int a = chunk * kChunk + __ffs(int(alive)) - 1;
    const CentreKey key = centre_key(degree[a], a);
    best = key > best ? key : best;
  }
  return best;
}

// One thread block of kGreedyThreads: the CPU's greedy loop over G (n rows of `pitch` bytes, pitch a multiple of
// kChunk, padding bytes 0) from its degrees (pitch of them). Thread t owns chunks t, t + kGreedyThreads, ...:
// alive[chunk] and degree[kChunk * chunk, + kChunk) are its alone. `removed` (n) lists each step's removed
// entries. Writes assignment[n], centres[0, n_codes) and *n_codes.
__global__ void __launch_bounds__(kGreedyThreads)
    greedy_codebook(const uint8_t* __restrict__ graph, int64_t pitch, int n, int32_t* degree, uint32_t* alive,
                    int32_t* removed, int32_t* n_codes, int32_t* assignment, int32_t* centres) {
  __shared__ CentreKey warp_best[kGreedyWarps];
  // The lengths of the removed lists of even and odd steps. Thread 0 resets the next step's during this one: the
  // step before last read it before its closing barrier, and the next step appends to it after this one's.
  __shared__ int removed_count[2];
  const int n_chunks = int(pitch / kChunk);
  auto chunk_of_row = [&](int row, int chunk) {
    return reinterpret_cast<const uint4*>(graph + int64_t(row) * pitch)[chunk];
  };

  if (threadIdx.x == 0) removed_count[0] = 0;
  CentreKey best = 0;
  for (int chunk = int(threadIdx.x); chunk < n_chunks; chunk += kGreedyThreads) {
    const int columns = min(kChunk, n - chunk * kChunk);  // at least 1: pitch rounds n up
    const uint32_t live = columns == kChunk ? 0xffffu : (1u << columns) - 1;
    alive[chunk] = live;
    const CentreKey key = best_alive(degree, chunk, live);
    best = key > best ? key : best;
  }
  CentreKey top = block_max(best, warp_best);
  int code = 0;
  for (; top != 0; ++code) {
    const int centre = centre_of(top);
    int* count = &removed_count[code % 2];
    if (threadIdx.x == 0) {
      centres[code] = centre;
      removed_count[(code + 1) % 2] = 0;
    }
    // The centre's alive neighbours, the centre among them, join code `code` and leave the graph.
    for (int chunk = int(threadIdx.x); chunk < n_chunks; chunk += kGreedyThreads) {
      const uint32_t live = alive[chunk];
      if (live == 0) continue;
      const uint32_t joining = live & ones_of(chunk_of_row(centre, chunk));
      if (joining == 0) continue;
      alive[chunk] = live & ~joining;
      int next = atomicAdd(count, __popc(joining));
      for (uint32_t m = joining; m != 0; m &= m - 1) {
        const int a = chunk * kChunk + __ffs(int(m)) - 1;
        assignment[a] = code;
        removed[next++] = a;
      }
    }
    __syncthreads();
    // Every alive column loses its edges to the removed entries (in any order: the degrees are integer sums).
    const int n_removed = *count;
    best = 0;
    for (int chunk = int(threadIdx.x); chunk < n_chunks; chunk += kGreedyThreads) {
      const uint32_t live = alive[chunk];
      if (live == 0) continue;
      for (int first = 0; first < n_removed; first += kMaxPackedRows) {
        const int last = min(n_removed, first + kMaxPackedRows);
        uint4 edges = make_uint4(0, 0, 0, 0);
        for (int r = first; r < last; ++r) {
          const uint4 w = chunk_of_row(removed[r], chunk);
          edges.x += w.x;
          edges.y += w.y;
          edges.z += w.z;
          edges.w += w.w;
        }
        subtract_edges(degree, chunk, edges);
      }
      const CentreKey key = best_alive(degree, chunk, live);
      best = key > best ? key : best;
    }
    top = block_max(best, warp_best);
  }
  if (threadIdx.x == 0) *n_codes = code;
}

// ---- The match ---------------------------------------------------------------------------------------------------

// A codebook index and its cosine; index -1: none yet.
struct Best {
  float similarity;
  int32_t index;
};

// The better of two: the higher cosine, then the lower index (a NaN cosine is never kept, see match_entries).
__device__ inline Best better(Best x, Best y) {
  const bool take_y = y.index >= 0 && (x.index < 0 || y.similarity > x.similarity ||
                                       (y.similarity == x.similarity && y.index < x.index));
  return take_y ? y : x;
}

// Grid |entries|, kThreads threads, head_dim floats of shared memory. Warp 0 computes the entry's unit vector;
// thread t then scores codebook vectors t, t + kThreads, ... with the CPU's strict > (its first best, NaN never),
// and the block keeps the best of the threads, so that the answer is the CPU's first best.
__global__ void match_entries(const uint8_t* pool, const EntryRef* entries, int head, bool key, KvGeometry g,
                              KeyRopeTable rope, const int32_t* codebook, int n_codebook, float* best_similarity,
                              int32_t* best_index) {
  extern __shared__ float unit[];
  __shared__ Best warp_best[kWarpsPerBlock];
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  if (warp == 0) warp_unit_vector(pool, entries[blockIdx.x], head, key, g, rope, unit, lane);
  __syncthreads();
  Best best{-INFINITY, -1};
  for (int c = int(threadIdx.x); c < n_codebook; c += kThreads) {
    const float* v = codebook_vector(pool, codebook[c], g.head_dim);
    float dot = 0.0f;
    for (int d = 0; d < g.head_dim; ++d) dot = __fadd_rn(dot, __fmul_rn(unit[d], v[d]));
    if (dot > best.similarity) best = Best{dot, c};
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    const Best other{__shfl_xor_sync(kFullWarp, best.similarity, offset),
                     __shfl_xor_sync(kFullWarp, best.index, offset)};
    best = better(best, other);
  }
  if (lane == 0) warp_best[warp] = best;
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (int w = 1; w < kWarpsPerBlock; ++w) best = better(best, warp_best[w]);
  best_similarity[blockIdx.x] = best.similarity;
  best_index[blockIdx.x] = best.index;
}

// ---- The encode --------------------------------------------------------------------------------------------------

// Grid ceil(n / kWarpsPerBlock), kThreads threads, kWarpsPerBlock x 2 x head_dim floats of shared memory: warp w
// of the grid codes entries[w]. It reads the whole entry (the key un-rotated) and takes both norms (lanes 0 and
// 1) before any lane writes, then writes the code row and, from entry first_write_back on, the reconstruction
// RoPE(k_magnitude * C[k_vector], position) and v_magnitude * C[v_vector] over the entry, in bf16.
__global__ void encode_entries(uint8_t* pool, const CodedEntry* entries, int n, int first_write_back, int head,
                               KvGeometry g, KeyRopeTable rope) {
  extern __shared__ float staged[];
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int item = int(blockIdx.x) * kWarpsPerBlock + warp;
  if (item >= n) return;
  const CodedEntry e = entries[item];
  float* key = staged + 2 * warp * g.head_dim;
  float* value = key + g.head_dim;
  for (int c = lane; c < g.head_dim; c += 32) {
    key[c] = entry_channel(pool, e.entry, head, true, g, rope, c);
    value[c] = entry_channel(pool, e.entry, head, false, g, rope, c);
  }
  __syncwarp();
  const float own = lane == 0 ? norm_in_order(key, g.head_dim) : lane == 1 ? norm_in_order(value, g.head_dim) : 0.0f;
  const KvCodeRow row{e.k_vector, __shfl_sync(kFullWarp, own, 0), e.v_vector, __shfl_sync(kFullWarp, own, 1),
                      e.entry.position};
  if (lane == 0) *reinterpret_cast<KvCodeRow*>(pool + e.row) = row;
  if (item < first_write_back) return;
  for (int c = lane; c < g.head_dim; c += 32) {
    store_bf16(pool, e.entry.block, g.k_element(head, e.entry.slot) + c,
               coded_key_channel(pool, row, rope, g.head_dim, c));
    store_bf16(pool, e.entry.block, g.v_element(head, e.entry.slot) + c,
               coded_value_channel(pool, row, g.head_dim, c));
  }
}

// ---- Host side ---------------------------------------------------------------------------------------------------

// SpindleKV on this backend: a bf16 pool without quantization, RoPE pairs in a head, and one of its KV heads.
void require_codebook_pool(const KvPoolView& pool, int head, const char* op) {
  require_bf16_pool(pool, op);
  const KvBlockLayout& L = pool.layout;
  if (L.quant != KvQuant::none) {
    throw std::invalid_argument(std::string(op) + ": SpindleKV's codebooks need a pool without quantization");
  }
  if (L.head_dim <= 0 || L.head_dim % 2 != 0) {
    throw std::invalid_argument(std::string(op) + ": RoPE needs an even head_dim");
  }
  require_head(pool, head, op);
}

// Keys are un-rotated with the pool's key RoPE table: every position must lie in it (std::out_of_range, as the
// CPU's rotate() answers).
void require_key_rope(const KvPoolView& pool, std::span<const int32_t> positions, const char* op) {
  for (int32_t p : positions) {
    if (p < 0 || p >= pool.key_rope.n_positions) {
      throw std::out_of_range(std::string(op) + ": position " + std::to_string(p) + " outside the key RoPE table (" +
                              std::to_string(pool.key_rope.n_positions) + " positions)");
    }
  }
  if (!positions.empty() && pool.key_rope.table == nullptr) {
    throw std::invalid_argument(std::string(op) + ": the pool view has no key RoPE table");
  }
}

// Codebook vector ids inside the pool (a view with n_slots 0 cannot say where it ends: the sign only).
void require_vectors(const KvPoolView& pool, std::span<const int32_t> ids, const char* op) {
  const int64_t n_vectors = int64_t(pool.n_slots) * pool.layout.vectors_per_slot();
  for (int32_t id : ids) {
    if (id < 0 || (pool.n_slots > 0 && id >= n_vectors)) {
      throw std::invalid_argument(std::string(op) + ": codebook vector " + std::to_string(id) +
                                  " outside the pool");
    }
  }
}

// Entry `entry` of the table, which must be in a full-precision block, read at `position`.
EntryRef entry_ref(const KvPoolView& pool, std::span<const int32_t> table, int64_t entry, int32_t position,
                   const char* op) {
  const int bs = pool.layout.block_size;
  if (entry < 0 || entry >= int64_t(table.size()) * bs) {
    throw std::invalid_argument(std::string(op) + ": entry " + std::to_string(entry) + " outside the table's " +
                                std::to_string(table.size() * size_t(bs)) + " entries");
  }
  return EntryRef{full_block_offset(pool, table[size_t(entry / bs)], op), int32_t(entry % bs), position};
}

// Unit vectors to write: of entries[i] into the floats at offsets[i].
struct UnitVectors {
  std::vector<EntryRef> entries;
  std::vector<int64_t> offsets;
};

void write_unit_vectors(CudaContext& ctx, const UnitVectors& u, const KvPoolView& pool, int head, bool key,
                        float* dst, const char* op) {
  if (u.entries.empty()) return;
  const KvGeometry g = geometry_of(pool.layout);
  const int n = int(u.entries.size());
  unit_vectors<<<blocks_for(n, kWarpsPerBlock), kThreads, sizeof(float) * kWarpsPerBlock * size_t(g.head_dim),
                 ctx.stream()>>>(static_cast<const uint8_t*>(pool.base), ctx.upload_structs<int64_t>(u.entries), n,
                                 head, key, g, key_rope_of(pool), dst, ctx.upload(u.offsets));
  check_launch(op);
}

}  // namespace

int kv_codebook_build(CudaContext& ctx, std::span<const int32_t> block_table, int head, KvPart part,
                      std::span<const int32_t> positions, float threshold, const KvPoolView& pool,
                      std::span<int32_t> assignment, std::span<int32_t> centres) {
  const char* op = "kv_codebook_build";
  require_codebook_pool(pool, head, op);
  const int n = int(positions.size());
  if (int(assignment.size()) != n || int(centres.size()) < n) {
    throw std::invalid_argument("kv_codebook_build: outputs must hold one index per entry");
  }
  const bool key = part == KvPart::key;
  if (key) require_key_rope(pool, positions, op);
  const int hd = pool.layout.head_dim;
  UnitVectors u;
  for (int i = 0; i < n; ++i) {
    u.entries.push_back(entry_ref(pool, block_table, i, positions[size_t(i)], op));
    u.offsets.push_back(int64_t(i) * hd);
  }
  if (n == 0) return 0;

  const int64_t pitch = (int64_t(n) + kChunk - 1) / kChunk * kChunk;
  auto* unit = static_cast<float*>(ctx.scratch(sizeof(float) * size_t(n) * size_t(hd)));
  auto* graph = static_cast<uint8_t*>(ctx.scratch(size_t(n) * size_t(pitch)));
  auto* degree = static_cast<int32_t*>(ctx.scratch(sizeof(int32_t) * size_t(pitch)));
  auto* alive = static_cast<uint32_t*>(ctx.scratch(sizeof(uint32_t) * size_t(pitch / kChunk)));
  auto* removed = static_cast<int32_t*>(ctx.scratch(sizeof(int32_t) * size_t(n)));
  // One download: the codebook's size, then assignment[n], then centres[n].
  auto* result = static_cast<int32_t*>(ctx.scratch(sizeof(int32_t) * (1 + 2 * size_t(n))));

  write_unit_vectors(ctx, u, pool, head, key, unit, "kv_codebook_build (unit_vectors)");
  const unsigned tiles = blocks_for(n, kTile);
  adjacency<<<dim3(tiles, tiles), kTileThreads, 0, ctx.stream()>>>(unit, n, hd, threshold, graph, pitch);
  check_launch("kv_codebook_build (adjacency)");
  degrees<<<blocks_for(pitch, kWarpsPerBlock), kThreads, 0, ctx.stream()>>>(graph, pitch, n, degree);
  check_launch("kv_codebook_build (degrees)");
  greedy_codebook<<<1, kGreedyThreads, 0, ctx.stream()>>>(graph, pitch, n, degree, alive, removed, result,
                                                          result + 1, result + 1 + n);
  check_launch("kv_codebook_build (greedy_codebook)");

  std::vector<int32_t> host(1 + 2 * size_t(n));
  ctx.download(result, host.data(), sizeof(int32_t) * host.size());
  const int n_codes = host[0];
  std::copy_n(host.begin() + 1, n, assignment.begin());
  std::copy_n(host.begin() + 1 + n, n_codes, centres.begin());
  return n_codes;
}

void kv_codebook_match(CudaContext& ctx, std::span<const int32_t> block_table, int head, KvPart part,
                       std::span<const int32_t> entries, std::span<const int32_t> positions,
                       std::span<const int32_t> codebook, const KvPoolView& pool, std::span<float> best_similarity,
                       std::span<int32_t> best_index) {
  const char* op = "kv_codebook_match";
  require_codebook_pool(pool, head, op);
  if (positions.size() != entries.size() || best_similarity.size() != entries.size() ||
      best_index.size() != entries.size()) {
    throw std::invalid_argument("kv_codebook_match: one position and one output per entry");
  }
  const bool key = part == KvPart::key;
  if (key) require_key_rope(pool, positions, op);
  std::vector<EntryRef> refs;
  for (size_t i = 0; i < entries.size(); ++i) {
    refs.push_back(entry_ref(pool, block_table, entries[i], positions[i], op));
  }
  require_vectors(pool, codebook, op);
  if (entries.empty()) return;

  const KvGeometry g = geometry_of(pool.layout);
  auto* similarity = static_cast<float*>(ctx.scratch(sizeof(float) * entries.size()));
  auto* index = static_cast<int32_t*>(ctx.scratch(sizeof(int32_t) * entries.size()));
  match_entries<<<unsigned(entries.size()), kThreads, sizeof(float) * size_t(g.head_dim), ctx.stream()>>>(
      static_cast<const uint8_t*>(pool.base), ctx.upload_structs<int64_t>(refs), head, key, g, key_rope_of(pool),
      ctx.upload(codebook), int(codebook.size()), similarity, index);
  check_launch("kv_codebook_match (match_entries)");
  ctx.download(similarity, best_similarity.data(), best_similarity.size_bytes());
  ctx.download(index, best_index.data(), best_index.size_bytes());
}

void kv_codebook_encode(CudaContext& ctx, std::span<const int32_t> block_table, const KvCodebookEncoding& e,
                        const KvPoolView& pool) {
  const char* op = "kv_codebook_encode";
  require_codebook_pool(pool, e.head, op);
  const KvBlockLayout& L = pool.layout;
  const int n = int(e.positions.size());
  if (int(e.k_vectors.size()) != n || int(e.v_vectors.size()) != n) {
    throw std::invalid_argument("kv_codebook_encode: one key and one value vector id per entry");
  }
  if (e.new_k_entries.size() != e.new_k_vectors.size() || e.new_v_entries.size() != e.new_v_vectors.size()) {
    throw std::invalid_argument("kv_codebook_encode: one vector id per new codebook vector");
  }
  require_key_rope(pool, e.positions, op);  // every entry's key is read, un-rotated

  std::vector<CodedEntry> coded;
  for (int i = 0; i < n; ++i) {
    const int64_t entry = int64_t(e.entry_begin) + i;
    const EntryRef ref = entry_ref(pool, block_table, entry, e.positions[size_t(i)], op);
    const int64_t block = entry / L.block_size - e.entry_begin / L.block_size;
    if (block >= int64_t(e.coded_blocks.size())) {
      throw std::invalid_argument("kv_codebook_encode: no coded block for entry " + std::to_string(entry));
    }
    const int64_t row = coded_block_offset(pool, e.coded_blocks[size_t(block)], op) +
                        L.code_row_index(e.head, ref.slot) * int64_t(sizeof(KvCodeRow));
    coded.push_back(CodedEntry{ref, row, e.k_vectors[size_t(i)], e.v_vectors[size_t(i)]});
  }
  require_vectors(pool, e.k_vectors, op);
  require_vectors(pool, e.v_vectors, op);
  require_vectors(pool, e.new_k_vectors, op);
  require_vectors(pool, e.new_v_vectors, op);
  // New vectors are written in parallel: an id named twice would race (the CPU keeps the last).
  std::vector<int32_t> new_ids = e.new_k_vectors;
  new_ids.insert(new_ids.end(), e.new_v_vectors.begin(), e.new_v_vectors.end());
  std::sort(new_ids.begin(), new_ids.end());
  if (const auto twice = std::adjacent_find(new_ids.begin(), new_ids.end()); twice != new_ids.end()) {
    throw std::invalid_argument("kv_codebook_encode: codebook vector " + std::to_string(*twice) + " is new twice");
  }
  auto new_vectors = [&](const std::vector<int32_t>& entries, const std::vector<int32_t>& vectors) {
    UnitVectors u;
    for (size_t i = 0; i < entries.size(); ++i) {
      if (entries[i] < e.entry_begin || int64_t(entries[i]) >= int64_t(e.entry_begin) + n) {
        throw std::invalid_argument("kv_codebook_encode: new codebook vector from entry " +
                                    std::to_string(entries[i]) + " outside the encoded entries");
      }
      u.entries.push_back(coded[size_t(entries[i] - e.entry_begin)].entry);
      u.offsets.push_back(int64_t(vectors[i]) * L.head_dim);
    }
    return u;
  };
  const UnitVectors new_keys = new_vectors(e.new_k_entries, e.new_k_vectors);
  const UnitVectors new_values = new_vectors(e.new_v_entries, e.new_v_vectors);
  if (n == 0) return;

  // The new vectors first: they are read from entries that the write-back overwrites.
  auto* vectors = static_cast<float*>(pool.base);
  write_unit_vectors(ctx, new_keys, pool, e.head, true, vectors, "kv_codebook_encode (unit_vectors, keys)");
  write_unit_vectors(ctx, new_values, pool, e.head, false, vectors, "kv_codebook_encode (unit_vectors, values)");
  const KvGeometry g = geometry_of(L);
  const int first_write_back = int(std::clamp<int64_t>(int64_t(e.write_back_from) - e.entry_begin, 0, n));
  encode_entries<<<blocks_for(n, kWarpsPerBlock), kThreads, sizeof(float) * 2 * kWarpsPerBlock * size_t(g.head_dim),
                   ctx.stream()>>>(static_cast<uint8_t*>(pool.base), ctx.upload_structs<int64_t>(coded), n,
                                   first_write_back, e.head, g, key_rope_of(pool));
  check_launch("kv_codebook_encode (encode_entries)");
}

}  // namespace strata::cuda
