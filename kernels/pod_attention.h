#pragma once
// PoD attention (../shared/specs/pod.md §2, §4; docs/compression.md "PoD"). For query row i of a sequence and one
// query head, the cache entries split into
//   proximal P(i) = {j < sinks} ∪ {i - recent < j <= i}   scored with the layer's own query and keys, and
//   distant  D(i) = {sinks <= j <= i - recent}             scored with the *distant query* against the *distant
//                                                           keys* (the block leader's query and keys; a leader's
//                                                           own, which makes it plain attention),
// both weighted over the layer's own values, and merged with the parameter-free gate
//   g = Σexp(aP) / (Σexp(aP) + Σexp(aD)) = σ(lseP − lseD),   o = g·oP + (1 − g)·oD,
// which is one softmax over the concatenated logits [aP; aD].
//
// Follower layers may hold their distant entries without keys ("paired" blocks, below). Entries are cache
// positions: a PoD layer never evicts, so entry j of every layer of a sequence is the token at position j.
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

namespace strata {

struct PodWindow {
  int sinks = 16;    // n_s
  int recent = 1008;  // n_r: the query itself and the recent - 1 entries before it
};

// The distant part of one sequence in one layer: per local KV head, the block table whose keys score the distant
// entries (the leader layer's table; the layer's own at a leader), and the rows of the distant query matrix
// (a [T, H * Dh] matrix per KV head: the leader layer's queries of this step).
struct PodDistant {
  std::vector<std::span<const int32_t>> key_tables;  // [n_kv_heads local]
  std::vector<const float*> queries;                 // [n_kv_heads local]: row-major [T, H * Dh], same rows as q
};

// A paired block (PoD storage, docs/compression.md): once two consecutive blocks of a follower layer hold only
// distant entries, the second one's values move into the first one's key region and its block returns to the
// pool. The block table then names the first block twice: as itself (values in its value region) and as
// pod_paired_id(first) (values in its key region). Paired ids are negative, so no other op mistakes them.
inline int32_t pod_paired_id(int32_t block) { return -block - 1; }
inline bool pod_is_paired(int32_t id) { return id < 0; }
inline int32_t pod_paired_block(int32_t id) { return -id - 1; }

// The gate and the merge in log-sum-exp form. lse_distant = -inf (no distant entries) gives g = 1.
inline float pod_gate(float lse_proximal, float lse_distant) {
  if (std::isinf(lse_distant) && lse_distant < 0) return 1.0f;
  return 1.0f / (1.0f + std::exp(lse_distant - lse_proximal));
}

}  // namespace strata
