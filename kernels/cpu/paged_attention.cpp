// Causal attention over the paged KV cache, and the write of new keys and values into it (CPU reference).
// One code path serves prefill chunks and decode steps: query i of a sequence sees cache entries
// [0, n_ctx_before + i]. Entries are in cache order, which is also causal order, also after compression
// (policies only remove entries; new ones are always appended).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/cpu_ops.h"

namespace strata::cpu {

void kv_write(const float* k, const float* v, std::span<const AttentionSequence> seqs, const KvPoolView& pool) {
  const KvBlockLayout& L = pool.layout;
  const int64_t row = int64_t(L.n_kv_heads) * L.head_dim;
  for (const AttentionSequence& s : seqs) {
    for (int i = 0; i < s.n_q; ++i) {
      const int entry = s.n_ctx_before + i;
      float* block = pool.block_f32(s.block_table[entry / L.block_size]);
      const int slot = entry % L.block_size;
      const int64_t src = int64_t(s.q_begin + i) * row;
      for (int h = 0; h < L.n_kv_heads; ++h) {
        std::memcpy(block + L.k_offset(h, slot), k + src + int64_t(h) * L.head_dim, sizeof(float) * L.head_dim);
        std::memcpy(block + L.v_offset(h, slot), v + src + int64_t(h) * L.head_dim, sizeof(float) * L.head_dim);
      }
    }
  }
}

void kv_compact(std::span<const int32_t> block_table, std::span<const int32_t> kept, const KvPoolView& pool,
                int head) {
  const KvBlockLayout& L = pool.layout;
  const int h_begin = head < 0 ? 0 : head, h_end = head < 0 ? L.n_kv_heads : head + 1;
  for (size_t j = 0; j < kept.size(); ++j) {
    const int from = kept[j];
    if (from == int(j)) continue;
    const float* src = pool.block_f32(block_table[from / L.block_size]);
    float* dst = pool.block_f32(block_table[j / L.block_size]);
    for (int h = h_begin; h < h_end; ++h) {
      std::memmove(dst + L.k_offset(h, int(j) % L.block_size), src + L.k_offset(h, from % L.block_size),
                   sizeof(float) * L.head_dim);
      std::memmove(dst + L.v_offset(h, int(j) % L.block_size), src + L.v_offset(h, from % L.block_size),
                   sizeof(float) * L.head_dim);
    }
  }
}

namespace {

float dot(const float* a, const float* b, int n) {
  float acc = 0.0f;
  for (int i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

// A run of query rows of one (sequence, head). Rows that add to column sums stay in one item: one thread owns
// a head's sums, so no two threads add to the same cell.
struct QueryItem {
  int seq;
  int head;
  int row_begin;  // query indices inside the sequence's rows
  int row_end;
};

constexpr int kRowsPerItem = 4;

}  // namespace

void paged_attention(const float* q, std::span<const AttentionSequence> seqs, const KvPoolView& pool, int n_heads,
                     float scale, float* out) {
  const KvBlockLayout& L = pool.layout;
  const int hd = L.head_dim;
  const int group = n_heads / L.n_kv_heads;
  const int64_t q_row = int64_t(n_heads) * hd;

  std::vector<QueryItem> items;
  for (int s = 0; s < int(seqs.size()); ++s) {
    const int step = seqs[s].column_sums ? seqs[s].n_q : kRowsPerItem;
    for (int h = 0; h < n_heads; ++h) {
      for (int i = 0; i < seqs[s].n_q; i += step) items.push_back({s, h, i, std::min(i + step, seqs[s].n_q)});
    }
  }

#pragma omp parallel
  {
    std::vector<float> scores;
#pragma omp for schedule(dynamic, 4)
    for (size_t it = 0; it < items.size(); ++it) {
      const QueryItem& item = items[it];
      const AttentionSequence& s = seqs[item.seq];
      const int kv_head = item.head / group;
      float* sums = s.column_sums ? s.column_sums + int64_t(item.head) * s.sums_stride : nullptr;
      for (int row = item.row_begin; row < item.row_end; ++row) {
        const float* qv = q + int64_t(s.q_begin + row) * q_row + int64_t(item.head) * hd;
        float* o = out + int64_t(s.q_begin + row) * q_row + int64_t(item.head) * hd;
        const int n_keys = s.n_ctx_before + row + 1;
        scores.resize(n_keys);

        float max_score = -INFINITY;
        for (int e0 = 0; e0 < n_keys; e0 += L.block_size) {
          const float* block = pool.block_f32(s.block_table[e0 / L.block_size]);
          const int n = std::min(L.block_size, n_keys - e0);
          for (int j = 0; j < n; ++j) {
            const float sc = dot(qv, block + L.k_offset(kv_head, j), hd) * scale;
            scores[e0 + j] = sc;
            max_score = std::max(max_score, sc);
          }
        }
        float sum = 0.0f;
        for (int e = 0; e < n_keys; ++e) {
          scores[e] = std::exp(scores[e] - max_score);
          sum += scores[e];
        }
        const float inv_sum = 1.0f / sum;
        for (int e = 0; e < n_keys; ++e) scores[e] *= inv_sum;
        if (sums && row >= s.stats_row_begin) {
          for (int e = 0; e < n_keys; ++e) sums[e] += scores[e];
        }
        std::fill(o, o + hd, 0.0f);
        for (int e0 = 0; e0 < n_keys; e0 += L.block_size) {
          const float* block = pool.block_f32(s.block_table[e0 / L.block_size]);
          const int n = std::min(L.block_size, n_keys - e0);
          for (int j = 0; j < n; ++j) {
            const float p = scores[e0 + j];
            const float* vv = block + L.v_offset(kv_head, j);
            for (int d = 0; d < hd; ++d) o[d] += p * vv[d];
          }
        }
      }
    }
  }
}

}  // namespace strata::cpu
