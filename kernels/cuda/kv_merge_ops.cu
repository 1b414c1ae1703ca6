// D2O's cache ops on CUDA (the CPU twin is kernels/cpu/kv_merge_ops.cpp): the cosine-nearest candidate key of each
// query key (kv_nearest_keys) and the weighted merge of evicted entries into kept ones (kv_merge), over bf16
// full-precision blocks with fp32 arithmetic. Work: kv_nearest_keys reads each candidate key once per query
// (|queries| x |candidates| x head_dim multiply-adds, the candidate norms computed once); kv_merge reads
// (1 + sources) x 2 x head_dim elements and writes 2 x head_dim per target.
#include <cmath>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/kv_device.cuh"

namespace strata::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kThreads = 32 * kWarpsPerBlock;
// torch.nn.functional.cosine_similarity clamps each norm to this.
constexpr float kNormEpsilon = 1e-8f;

// The key row of `entry` in KV head `head`; blocks[] holds the table's byte offsets.
__device__ inline const __nv_bfloat16* key_row(const uint8_t* base, const int64_t* blocks, int entry, int head,
                                               const KvGeometry& g) {
  return reinterpret_cast<const __nv_bfloat16*>(base + blocks[entry / g.block_size]) +
         g.k_element(head, entry % g.block_size);
}

// Grid ceil(candidates / kWarpsPerBlock), kThreads threads: warp w of the grid computes norm[w] of candidate key w,
// its lanes striding over the channels.
__global__ void candidate_norms(const uint8_t* base, const int64_t* blocks, const int32_t* candidates,
                                int n_candidates, int head, float* norms, KvGeometry g) {
  const int c = int(blockIdx.x) * kWarpsPerBlock + int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  if (c >= n_candidates) return;
  const __nv_bfloat16* k = key_row(base, blocks, candidates[c], head, g);
  float sq = 0.0f;
  for (int d = lane; d < g.head_dim; d += 32) sq += __bfloat162float(k[d]) * __bfloat162float(k[d]);
  sq = warp_sum(sq);
  if (lane == 0) norms[c] = fmaxf(sqrtf(sq), kNormEpsilon);
}

// Grid |queries|, kThreads threads, head_dim floats of dynamic shared memory (the query key). Warp w scores
// candidates w, w + kWarpsPerBlock, ... (lanes over the channels, a shuffle sum), keeping its best with the lower
// index on ties; thread 0 then takes the best of the warps, again the lower index on ties.
__global__ void nearest_keys(const uint8_t* base, const int64_t* blocks, const int32_t* queries,
                             const int32_t* candidates, int n_candidates, const float* norms, int head,
                             float* best_similarity, int32_t* best_candidate, KvGeometry g) {
  extern __shared__ float query[];
  __shared__ float warp_best[kWarpsPerBlock];
  __shared__ int warp_arg[kWarpsPerBlock];
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const __nv_bfloat16* q = key_row(base, blocks, queries[blockIdx.x], head, g);
  for (int d = int(threadIdx.x); d < g.head_dim; d += int(blockDim.x)) query[d] = __bfloat162float(q[d]);
  __syncthreads();
  float sq = 0.0f;
  for (int d = lane; d < g.head_dim; d += 32) sq += query[d] * query[d];
  const float q_norm = fmaxf(sqrtf(warp_sum(sq)), kNormEpsilon);

  float best = -INFINITY;
  int arg = -1;
  for (int c = warp; c < n_candidates; c += kWarpsPerBlock) {
    const __nv_bfloat16* k = key_row(base, blocks, candidates[c], head, g);
    float dot = 0.0f;
    for (int d = lane; d < g.head_dim; d += 32) dot += query[d] * __bfloat162float(k[d]);
    const float cosine = warp_sum(dot) / (q_norm * norms[c]);
    if (cosine > best) {  // c grows, so a tie keeps the lower index
      best = cosine;
      arg = c;
    }
  }
  if (lane == 0) {
    warp_best[warp] = best;
    warp_arg[warp] = arg;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (int w = 0; w < kWarpsPerBlock; ++w) {
    const int a = warp_arg[w];
    if (a >= 0 && (arg < 0 || warp_best[w] > best || (warp_best[w] == best && a < arg))) {
      best = warp_best[w];
      arg = a;
    }
  }
  best_similarity[blockIdx.x] = best;
  best_candidate[blockIdx.x] = arg >= 0 ? arg : 0;  // every cosine NaN: -inf at candidate 0, as the CPU answers
}

// The merge arrays on the device (kernels/kv_merge.h).
struct DeviceMerges {
  const int32_t* targets;
  const float* target_weights;
  const int32_t* source_begin;
  const int32_t* sources;
  const float* source_weights;
};

// Grid |targets|, kThreads threads over the channels of K then V. Each thread reads and writes only its own
// element of the target; sources are never targets, so no thread reads what another writes. The sum runs in the
// CPU twin's order without fused multiply-adds.
__global__ void merge_entries(uint8_t* base, const int64_t* blocks, DeviceMerges m, int head, KvGeometry g) {
  const int t = int(blockIdx.x);
  auto element = [&](int entry, int i) {  // i < head_dim: key channel i; otherwise value channel i - head_dim
    const int slot = entry % g.block_size;
    return i < g.head_dim ? g.k_element(head, slot) + i : g.v_element(head, slot) + i - g.head_dim;
  };
  const int target = m.targets[t];
  const int64_t target_block = blocks[target / g.block_size];
  for (int i = int(threadIdx.x); i < 2 * g.head_dim; i += int(blockDim.x)) {
    float acc = __fmul_rn(m.target_weights[t], load_bf16(base, target_block, element(target, i)));
    for (int s = m.source_begin[t]; s < m.source_begin[t + 1]; ++s) {
      const int source = m.sources[s];
      const float x = load_bf16(base, blocks[source / g.block_size], element(source, i));
      acc = __fadd_rn(acc, __fmul_rn(m.source_weights[s], x));
    }
    store_bf16(base, target_block, element(target, i), acc);
  }
}

void require_entries(std::span<const int32_t> entries, int64_t n_entries, const char* op, const char* what) {
  for (int32_t e : entries) {
    if (e < 0 || e >= n_entries) {
      throw std::invalid_argument(std::string(op) + ": " + what + " entry " + std::to_string(e) +
                                  " outside the table's " + std::to_string(n_entries) + " entries");
    }
  }
}

}  // namespace

void kv_nearest_keys(CudaContext& ctx, std::span<const int32_t> block_table, int head,
                     std::span<const int32_t> queries, std::span<const int32_t> candidates, const KvPoolView& pool,
                     std::span<float> best_similarity, std::span<int32_t> best_candidate) {
  require_bf16_pool(pool, "kv_nearest_keys");
  require_head(pool, head, "kv_nearest_keys");
  if (best_similarity.size() != queries.size() || best_candidate.size() != queries.size()) {
    throw std::invalid_argument("kv_nearest_keys: one output per query entry");
  }
  if (candidates.empty() && !queries.empty()) throw std::invalid_argument("kv_nearest_keys: no candidates");
  const std::vector<int64_t> offsets = full_block_offsets(pool, block_table, "kv_nearest_keys");
  const int64_t n_entries = int64_t(block_table.size()) * pool.layout.block_size;
  require_entries(queries, n_entries, "kv_nearest_keys", "query");
  require_entries(candidates, n_entries, "kv_nearest_keys", "candidate");
  if (queries.empty()) return;

  const KvGeometry g = geometry_of(pool.layout);
  const auto* base = static_cast<const uint8_t*>(pool.base);
  const int64_t* blocks = ctx.upload(offsets);
  const int32_t* device_candidates = ctx.upload(candidates);
  const int n_candidates = int(candidates.size());
  auto* norms = static_cast<float*>(ctx.scratch(sizeof(float) * candidates.size()));
  candidate_norms<<<blocks_for(n_candidates, kWarpsPerBlock), kThreads, 0, ctx.stream()>>>(
      base, blocks, device_candidates, n_candidates, head, norms, g);
  check_launch("kv_nearest_keys (candidate_norms)");
  auto* similarity = static_cast<float*>(ctx.scratch(sizeof(float) * queries.size()));
  auto* candidate = static_cast<int32_t*>(ctx.scratch(sizeof(int32_t) * queries.size()));
  nearest_keys<<<unsigned(queries.size()), kThreads, sizeof(float) * size_t(g.head_dim), ctx.stream()>>>(
      base, blocks, ctx.upload(queries), device_candidates, n_candidates, norms, head, similarity, candidate, g);
  check_launch("kv_nearest_keys (nearest_keys)");
  ctx.download(similarity, best_similarity.data(), best_similarity.size_bytes());
  ctx.download(candidate, best_candidate.data(), best_candidate.size_bytes());
}

void kv_merge(CudaContext& ctx, std::span<const int32_t> block_table, const KvMerges& merges, const KvPoolView& pool,
              int head) {
  require_bf16_pool(pool, "kv_merge");
  require_head(pool, head, "kv_merge");
  const std::vector<int64_t> offsets = full_block_offsets(pool, block_table, "kv_merge");
  if (merges.empty()) return;
  if (merges.target_weights.size() != merges.targets.size() ||
      merges.source_begin.size() != merges.targets.size() + 1 || merges.source_begin.front() != 0 ||
      merges.source_weights.size() != merges.sources.size() || merges.source_begin.back() != int(merges.n_sources())) {
    throw std::invalid_argument("kv_merge: inconsistent merge arrays");
  }
  for (size_t t = 0; t + 1 < merges.source_begin.size(); ++t) {
    if (merges.source_begin[t + 1] < merges.source_begin[t]) {
      throw std::invalid_argument("kv_merge: source_begin must not decrease");
    }
  }
  const int64_t n_entries = int64_t(block_table.size()) * pool.layout.block_size;
  require_entries(merges.targets, n_entries, "kv_merge", "target");
  require_entries(merges.sources, n_entries, "kv_merge", "source");
  // Thread blocks run targets in parallel: a target merged twice, or read as a source, would race.
  std::vector<uint8_t> is_target(size_t(n_entries), 0);
  for (int32_t t : merges.targets) {
    if (is_target[size_t(t)]) {
      throw std::invalid_argument("kv_merge: entry " + std::to_string(t) + " is merged into twice");
    }
    is_target[size_t(t)] = 1;
  }
  for (int32_t s : merges.sources) {
    if (is_target[size_t(s)]) {
      throw std::invalid_argument("kv_merge: entry " + std::to_string(s) + " is a target and a source");
    }
  }

  const DeviceMerges m{ctx.upload(merges.targets), ctx.upload(merges.target_weights),
                       ctx.upload(merges.source_begin), ctx.upload(merges.sources),
                       ctx.upload(merges.source_weights)};
  merge_entries<<<unsigned(merges.targets.size()), kThreads, 0, ctx.stream()>>>(
      static_cast<uint8_t*>(pool.base), ctx.upload(offsets), m, head, geometry_of(pool.layout));
  check_launch("kv_merge (merge_entries)");
}

}  // namespace strata::cuda
