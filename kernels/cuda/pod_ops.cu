// PoD on CUDA (kernels/pod_attention.h; the CPU twin is kernels/cpu/pod_ops.cpp): attention whose distant entries
// are scored with the block leader's queries and keys, over the layer's own values, merged with the proximal part
// by the gate; and the pairing of a follower layer's key-free blocks (kv_pair_values).
//
// pod_attention runs one thread block per (query row, query head): its warps take the entries j = warp,
// warp + kWarps, ... of [0, pos] and keep two online softmaxes (running max, sum and value accumulator), one for
// the proximal and one for the distant entries; the block then merges the warps' partial softmaxes per part,
// which gives both parts' log-sum-exps, and the gate. fp32 arithmetic, bf16 keys and values.
// Work per (row, head): (pos + 1) x head_dim bf16 elements of keys and as many of values.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/kv_device.cuh"

namespace strata::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kMaxHeadDim = 256;
constexpr int kLaneChannels = kMaxHeadDim / 32;  // channels d = lane + 32 * k, k < kLaneChannels, per lane

// Everything pod_attention_rows reads, on the device. Block tables are resolved to byte offsets of their key and
// value regions ([n_kv_heads][block_size][head_dim] bf16 each; -1 where a block has none), concatenated over
// the sequences (own tables) and over (sequence, KV head) (the distant key tables).
struct PodArgs {
  const float* q;  // [T, n_heads * head_dim]
  float* out;      // likewise
  int64_t q_row = 0;  // n_heads * head_dim
  int group = 0;      // query heads per KV head
  int n_kv_heads = 0;
  float scale = 0.0f;
  int sinks = 0;
  int recent = 0;
  const int32_t* item_seq;         // [items]: the sequence of thread-block row x
  const int32_t* item_row;         // [items]: its row within the sequence
  const int32_t* seq_q_begin;      // [sequences]
  const int32_t* seq_ctx_before;   // [sequences]
  const int32_t* seq_table_begin;  // [sequences]: the first block of the sequence in own_keys / own_values
  const int64_t* own_keys;         // key region of each own block, -1 for paired blocks
  const int64_t* own_values;       // value region of each own block: a paired block's key region
  const int32_t* distant_table_begin;  // [sequences * n_kv_heads]: first block in distant_keys
  const int64_t* distant_keys;         // key region of each distant block
  const int64_t* distant_queries;      // [sequences * n_kv_heads]: device addresses of the distant query matrices
};

// One warp's online softmax over some entries: running max m, sum l of exp(logit - m), and o = Σ exp(logit - m) v
// for the channels this lane owns.
struct SoftmaxPart {
  float m = -INFINITY;
  float l = 0.0f;
  float o[kLaneChannels] = {};
};

__device__ inline void add_entry(SoftmaxPart& p, float logit, const __nv_bfloat16* v, int head_dim, int lane) {
  const float m_new = fmaxf(p.m, logit);
  const float correction = expf(p.m - m_new);  // 0 for the first entry (m = -inf)
  const float w = expf(logit - m_new);
  p.l = p.l * correction + w;
#pragma unroll
  for (int k = 0; k < kLaneChannels; ++k) {
    const int d = lane + 32 * k;
    if (d < head_dim) p.o[k] = p.o[k] * correction + w * __bfloat162float(v[d]);
  }
  p.m = m_new;
}

// The warps' partial softmaxes of one part, in shared memory.
struct PartialSoftmaxes {
  float m[kWarps];
  float l[kWarps];
  float o[kWarps][kMaxHeadDim];
};

__device__ inline void store_part(PartialSoftmaxes& s, const SoftmaxPart& p, int warp, int lane, int head_dim) {
  if (lane == 0) {
    s.m[warp] = p.m;
    s.l[warp] = p.l;
  }
#pragma unroll
  for (int k = 0; k < kLaneChannels; ++k) {
    const int d = lane + 32 * k;
    if (d < head_dim) s.o[warp][d] = p.o[k];
  }
}

// Channel d of softmax(logits) · V over the part's entries, and its log-sum-exp (-inf and 0 for no entries).
__device__ inline float merge_part(const PartialSoftmaxes& s, int d, float& lse) {
  float m = -INFINITY;
  for (int w = 0; w < kWarps; ++w) m = fmaxf(m, s.m[w]);
  if (m == -INFINITY) {
    lse = -INFINITY;
    return 0.0f;
  }
  float l = 0.0f, o = 0.0f;
  for (int w = 0; w < kWarps; ++w) {
    if (s.m[w] == -INFINITY) continue;  // a warp without entries of this part
    const float factor = expf(s.m[w] - m);
    l += s.l[w] * factor;
    o += s.o[w][d] * factor;
  }
  lse = m + logf(l);
  return o / l;
}

// Grid (items, n_heads), kThreads threads: item x is row item_row[x] of sequence item_seq[x], query head blockIdx.y.
__global__ void pod_attention_rows(const uint8_t* base, PodArgs a, KvGeometry g) {
  __shared__ float q_own[kMaxHeadDim];
  __shared__ float q_distant[kMaxHeadDim];
  __shared__ PartialSoftmaxes proximal_parts, distant_parts;
  const int s = a.item_seq[blockIdx.x], i = a.item_row[blockIdx.x];
  const int h = int(blockIdx.y), kv_head = h / a.group;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int hd = g.head_dim;
  const int64_t row = a.seq_q_begin[s] + i;
  const int pos = a.seq_ctx_before[s] + i;           // the query's own entry
  const int distant_end = pos - a.recent + 1;        // distant entries: [sinks, distant_end)
  const int64_t q_offset = row * a.q_row + int64_t(h) * hd;
  const auto* distant_q = reinterpret_cast<const float*>(a.distant_queries[s * a.n_kv_heads + kv_head]);
  for (int d = int(threadIdx.x); d < hd; d += int(blockDim.x)) {
    q_own[d] = a.q[q_offset + d];
    q_distant[d] = distant_q[q_offset + d];
  }
  __syncthreads();

  const int64_t* own_keys = a.own_keys + a.seq_table_begin[s];
  const int64_t* own_values = a.own_values + a.seq_table_begin[s];
  const int64_t* distant_keys = a.distant_keys + a.distant_table_begin[s * a.n_kv_heads + kv_head];
  SoftmaxPart proximal, distant;
  for (int j = warp; j <= pos; j += kWarps) {  // the loop bound is warp-uniform, as warp_sum needs
    const bool is_proximal = j < a.sinks || j >= distant_end;
    const int b = j / g.block_size;
    // Within a key or value region, (head, slot) is at element k_element(head, slot).
    const int64_t element = g.k_element(kv_head, j % g.block_size);
    const auto* k = reinterpret_cast<const __nv_bfloat16*>(base + (is_proximal ? own_keys[b] : distant_keys[b])) +
                    element;
    const float* qv = is_proximal ? q_own : q_distant;
    float dot = 0.0f;
    for (int d = lane; d < hd; d += 32) dot += qv[d] * __bfloat162float(k[d]);
    const float logit = warp_sum(dot) * a.scale;
    const auto* v = reinterpret_cast<const __nv_bfloat16*>(base + own_values[b]) + element;
    if (is_proximal) {
      add_entry(proximal, logit, v, hd, lane);
    } else {
      add_entry(distant, logit, v, hd, lane);
    }
  }
  store_part(proximal_parts, proximal, warp, lane, hd);
  store_part(distant_parts, distant, warp, lane, hd);
  __syncthreads();

  for (int d = int(threadIdx.x); d < hd; d += int(blockDim.x)) {
    float lse_proximal, lse_distant;
    const float o_proximal = merge_part(proximal_parts, d, lse_proximal);
    const float o_distant = merge_part(distant_parts, d, lse_distant);
    // pod_gate (kernels/pod_attention.h): 1 without distant entries, else sigmoid(lseP - lseD).
    const float gate = lse_distant == -INFINITY ? 1.0f : 1.0f / (1.0f + expf(lse_distant - lse_proximal));
    a.out[q_offset + d] = gate * o_proximal + (1.0f - gate) * o_distant;
  }
}

// Byte offsets of a block's key and value regions (-1: none). A paired id's values sit in its block's key region.
int64_t key_region(const KvPoolView& pool, int32_t id) {
  if (pod_is_paired(id) || pool.is_quantized(id)) return -1;
  return full_block_offset(pool, id, "pod attention");
}
int64_t value_region(const KvPoolView& pool, int32_t id) {
  if (pod_is_paired(id)) return full_block_offset(pool, pod_paired_block(id), "pod attention");
  if (pool.is_quantized(id)) return -1;
  return full_block_offset(pool, id, "pod attention") + geometry_of(pool.layout).region_elements * 2;
}

// Checks that entries [begin, end) have a region in `regions` (one per table block), naming what is missing.
void require_regions(const std::vector<int64_t>& regions, size_t table_begin, size_t table_size, int begin, int end,
                     int block_size, const char* what) {
  for (int e = std::max(begin, 0); e < end; ++e) {
    const size_t b = size_t(e / block_size);
    if (b >= table_size) {
      throw std::invalid_argument("pod attention: entry " + std::to_string(e) + " is beyond its block table (" +
                                  std::to_string(table_size) + " blocks)");
    }
    if (regions[table_begin + b] < 0) {
      throw std::logic_error("pod attention: entry " + std::to_string(e) + " has no full-precision " + what);
    }
  }
}

// The device tables of one call: a work item per (sequence, query row), each sequence's rows and the regions of
// its own blocks, and per (sequence, KV head) its distant queries and the key regions of its distant blocks. Checks
// that every entry a row reads has the region it is read from.
struct PodTables {
  std::vector<int32_t> item_seq, item_row, seq_q_begin, seq_ctx_before, seq_table_begin, distant_table_begin;
  std::vector<int64_t> own_keys, own_values, distant_keys, distant_queries;
};

PodTables pod_tables(std::span<const AttentionSequence> seqs, std::span<const PodDistant> distant,
                     const KvPoolView& pool, const PodWindow& window, int64_t q_rows) {
  const KvBlockLayout& L = pool.layout;
  const int bs = L.block_size;
  PodTables t;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const AttentionSequence& seq = seqs[s];
    const PodDistant& dist = distant[s];
    if (int(dist.key_tables.size()) != L.n_kv_heads || int(dist.queries.size()) != L.n_kv_heads) {
      throw std::invalid_argument("pod attention: distant keys and queries for every KV head");
    }
    if (seq.q_begin < 0 || seq.n_q < 0 || seq.n_ctx_before < 0 || seq.q_begin + int64_t(seq.n_q) > q_rows) {
      throw std::invalid_argument("pod attention: sequence " + std::to_string(s) + "'s rows are outside q");
    }
    const int n_ctx = seq.n_ctx_before + seq.n_q;
    t.seq_q_begin.push_back(seq.q_begin);
    t.seq_ctx_before.push_back(seq.n_ctx_before);
    t.seq_table_begin.push_back(int32_t(t.own_keys.size()));
    const size_t own_begin = t.own_keys.size();
    for (int32_t id : seq.block_table) {
      t.own_keys.push_back(key_region(pool, id));
      t.own_values.push_back(value_region(pool, id));
    }
    // Own keys of the sinks and of the recent windows of all rows; values of every entry.
    require_regions(t.own_keys, own_begin, seq.block_table.size(), 0, std::min(window.sinks, n_ctx), bs, "key");
    if (window.recent > 0) {
      require_regions(t.own_keys, own_begin, seq.block_table.size(), seq.n_ctx_before - window.recent + 1, n_ctx, bs,
                      "key");
    }
    require_regions(t.own_values, own_begin, seq.block_table.size(), 0, n_ctx, bs, "value");
    for (int h = 0; h < L.n_kv_heads; ++h) {
      if (dist.queries[size_t(h)] == nullptr) throw std::invalid_argument("pod attention: no distant queries");
      t.distant_table_begin.push_back(int32_t(t.distant_keys.size()));
      t.distant_queries.push_back(int64_t(reinterpret_cast<intptr_t>(dist.queries[size_t(h)])));
      const size_t begin = t.distant_keys.size();
      for (int32_t id : dist.key_tables[size_t(h)]) t.distant_keys.push_back(key_region(pool, id));
      // The last row's distant entries are the widest: [sinks, n_ctx - recent), within [0, n_ctx).
      require_regions(t.distant_keys, begin, dist.key_tables[size_t(h)].size(), window.sinks,
                      std::min(n_ctx - window.recent, n_ctx), bs, "distant key");
    }
    for (int i = 0; i < seq.n_q; ++i) {
      t.item_seq.push_back(int32_t(s));
      t.item_row.push_back(i);
    }
  }
  return t;
}

}  // namespace

void pod_attention(CudaContext& ctx, const Tensor& q, std::span<const AttentionSequence> seqs,
                   std::span<const PodDistant> distant, const KvPoolView& pool, int n_heads, float scale,
                   const PodWindow& window, Tensor& out) {
  require_bf16_pool(pool, "pod attention");
  const KvBlockLayout& L = pool.layout;
  const int hd = L.head_dim;
  if (n_heads <= 0 || n_heads % L.n_kv_heads != 0) {
    throw std::invalid_argument("pod attention: " + std::to_string(n_heads) + " query heads for " +
                                std::to_string(L.n_kv_heads) + " KV heads");
  }
  if (hd > kMaxHeadDim) {
    throw std::invalid_argument("pod attention: head_dim " + std::to_string(hd) + " above " +
                                std::to_string(kMaxHeadDim));
  }
  const int64_t q_row = int64_t(n_heads) * hd;
  if (q.dtype != DType::f32 || out.dtype != DType::f32 || q.cols != q_row || out.cols != q_row ||
      out.rows != q.rows) {
    throw std::invalid_argument("pod attention: q and out must be f32 [T, n_heads * head_dim]");
  }
  if (distant.size() != seqs.size()) throw std::invalid_argument("pod attention: one PodDistant per sequence");

  const PodTables t = pod_tables(seqs, distant, pool, window, q.rows);
  if (t.item_seq.empty()) return;

  PodArgs a;
  a.q = static_cast<const float*>(q.data);
  a.out = static_cast<float*>(out.data);
  a.q_row = q_row;
  a.group = n_heads / L.n_kv_heads;
  a.n_kv_heads = L.n_kv_heads;
  a.scale = scale;
  a.sinks = window.sinks;
  a.recent = window.recent;
  a.item_seq = ctx.upload(t.item_seq);
  a.item_row = ctx.upload(t.item_row);
  a.seq_q_begin = ctx.upload(t.seq_q_begin);
  a.seq_ctx_before = ctx.upload(t.seq_ctx_before);
  a.seq_table_begin = ctx.upload(t.seq_table_begin);
  a.own_keys = ctx.upload(t.own_keys);
  a.own_values = ctx.upload(t.own_values);
  a.distant_table_begin = ctx.upload(t.distant_table_begin);
  a.distant_keys = ctx.upload(t.distant_keys);
  a.distant_queries = ctx.upload(t.distant_queries);
  const dim3 grid{unsigned(t.item_seq.size()), unsigned(n_heads)};
  pod_attention_rows<<<grid, kThreads, 0, ctx.stream()>>>(static_cast<const uint8_t*>(pool.base), a,
                                                           geometry_of(L));
  check_launch("pod attention (pod_attention_rows)");
}

void kv_pair_values(CudaContext& ctx, std::span<const int32_t> first, std::span<const int32_t> second,
                    const KvPoolView& pool) {
  require_bf16_pool(pool, "kv_pair_values");
  if (first.size() != second.size()) throw std::invalid_argument("kv_pair_values: one second block per first");
  // One region: all heads' K (or V) of a block, bf16.
  const size_t region_bytes = size_t(geometry_of(pool.layout).region_elements) * sizeof(__nv_bfloat16);
  auto* base = static_cast<uint8_t*>(pool.base);
  for (size_t i = 0; i < first.size(); ++i) {
    uint8_t* to = base + full_block_offset(pool, first[i], "kv_pair_values");
    const uint8_t* from = base + full_block_offset(pool, second[i], "kv_pair_values") + region_bytes;
    check(cudaMemcpyAsync(to, from, region_bytes, cudaMemcpyDeviceToDevice, ctx.stream()),
          "kv_pair_values (cudaMemcpyAsync)");
  }
}

}  // namespace strata::cuda
