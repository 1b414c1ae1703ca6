// D2O's cache ops on the CPU: the cosine nearest kept key of each evicted key, and the weighted merge of evicted
// entries into kept ones. Work: kv_nearest_keys reads |queries| + |candidates| keys and does
// |queries| x |candidates| dot products of head_dim (at the first eviction of a 4,000-token prompt at 20%:
// 3,200 x 800 x 64 multiply-adds per KV head); kv_merge reads and writes (1 + sources) x 2 x head_dim floats per
// target.
#include "kernels/cpu/kv_merge_ops.h"
#include "kernels/cpu/kv_rows.h"
#include "kernels/cpu/thread_pool.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

namespace strata::cpu {
namespace {

// torch.nn.functional.cosine_similarity clamps each norm to this.
constexpr double kNormEpsilon = 1e-8;

// Full-precision blocks only: a quantized layer (kv_cache.dtype int8 | int4 | int2) is never merged into, because
// D2O keeps its merging layers unsealed (CompressionPolicy::needs_unquantized).
void require_full_precision(std::span<const int32_t> block_table, const KvPoolView& pool, const char* op) {
  require_kv_element_type(pool, op);
  bool quantized = false;
  for (int32_t block : block_table) quantized = quantized || pool.is_quantized(block);
  if (quantized) throw std::invalid_argument(std::string(op) + ": the layer's KV blocks must not be quantized");
}

void require_head(const KvPoolView& pool, int head, const char* op) {
  if (head < 0 || head >= pool.layout.n_kv_heads) {
    throw std::invalid_argument(std::string(op) + ": KV head " + std::to_string(head) + " out of range");
  }
}

// Where the key (value) of `entry` is: its block and element offset.
struct EntryRow {
  int32_t block;
  int64_t offset;
};

EntryRow key_of(std::span<const int32_t> block_table, const KvPoolView& pool, int head, int32_t entry) {
  const KvBlockLayout& L = pool.layout;
  return {block_table[size_t(entry / L.block_size)], L.k_offset(head, entry % L.block_size)};
}

EntryRow value_of(std::span<const int32_t> block_table, const KvPoolView& pool, int head, int32_t entry) {
  const KvBlockLayout& L = pool.layout;
  return {block_table[size_t(entry / L.block_size)], L.v_offset(head, entry % L.block_size)};
}

void read_row(const KvPoolView& pool, EntryRow row, float* out) {
  read_kv_rows(pool, row.block, row.offset, pool.layout.head_dim, out);
}

double norm_of(const float* x, int n) {
  double acc = 0.0;
  for (int i = 0; i < n; ++i) acc += double(x[i]) * x[i];
  return std::max(std::sqrt(acc), kNormEpsilon);
}

}  // namespace

void kv_nearest_keys(std::span<const int32_t> block_table, int head, std::span<const int32_t> queries,
                     std::span<const int32_t> candidates, const KvPoolView& pool, std::span<float> best_similarity,
                     std::span<int32_t> best_candidate) {
  require_full_precision(block_table, pool, "kv_nearest_keys");
  require_head(pool, head, "kv_nearest_keys");
  if (best_similarity.size() != queries.size() || best_candidate.size() != queries.size()) {
    throw std::invalid_argument("kv_nearest_keys: one output per query entry");
  }
  if (candidates.empty() && !queries.empty()) throw std::invalid_argument("kv_nearest_keys: no candidates");
  const int hd = pool.layout.head_dim;
  // The candidates' keys as fp32, read once for all the queries.
  std::vector<float> keys(candidates.size() * size_t(hd));
  std::vector<double> candidate_norms(candidates.size());
  for (size_t c = 0; c < candidates.size(); ++c) {
    read_row(pool, key_of(block_table, pool, head, candidates[c]), keys.data() + c * size_t(hd));
    candidate_norms[c] = norm_of(keys.data() + c * size_t(hd), hd);
  }
  parallel_for(int64_t(queries.size()), 16, [&](int64_t begin, int64_t end) {
    std::vector<float> q(static_cast<size_t>(hd));
    for (size_t i = size_t(begin); i < size_t(end); ++i) {
      read_row(pool, key_of(block_table, pool, head, queries[i]), q.data());
      const double q_norm = norm_of(q.data(), hd);
      double best = -INFINITY;
      int32_t best_c = 0;
      for (size_t c = 0; c < candidates.size(); ++c) {
        const float* k = keys.data() + c * size_t(hd);
        double dot = 0.0;
        for (int d = 0; d < hd; ++d) dot += double(q[d]) * k[d];
        const double cosine = dot / (q_norm * candidate_norms[c]);
        if (cosine > best) {
          best = cosine;
          best_c = int32_t(c);
        }
      }
      best_similarity[i] = float(best);
      best_candidate[i] = best_c;
    }
  });
}

void kv_merge(std::span<const int32_t> block_table, const KvMerges& merges, const KvPoolView& pool, int head) {
  require_full_precision(block_table, pool, "kv_merge");
  require_head(pool, head, "kv_merge");
  if (merges.empty()) return;
  if (merges.target_weights.size() != merges.targets.size() ||
      merges.source_begin.size() != merges.targets.size() + 1 ||
      merges.source_weights.size() != merges.sources.size() || merges.source_begin.back() != int(merges.n_sources())) {
    throw std::invalid_argument("kv_merge: inconsistent merge arrays");
  }
  const int hd = pool.layout.head_dim;
  std::vector<float> acc(static_cast<size_t>(hd)), row(static_cast<size_t>(hd));
  for (size_t t = 0; t < merges.targets.size(); ++t) {
    for (auto vector_of : {key_of, value_of}) {
      const EntryRow target = vector_of(block_table, pool, head, merges.targets[t]);
      read_row(pool, target, row.data());
      for (int d = 0; d < hd; ++d) acc[size_t(d)] = merges.target_weights[t] * row[size_t(d)];
      for (int s = merges.source_begin[t]; s < merges.source_begin[t + 1]; ++s) {
        read_row(pool, vector_of(block_table, pool, head, merges.sources[size_t(s)]), row.data());
        const float w = merges.source_weights[size_t(s)];
        for (int d = 0; d < hd; ++d) acc[size_t(d)] += w * row[size_t(d)];
      }
      write_kv_rows(pool, target.block, target.offset, acc.data(), hd);
    }
  }
}

}  // namespace strata::cpu
