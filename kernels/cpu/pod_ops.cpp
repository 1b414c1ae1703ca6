// PoD attention and the pairing of key-free blocks (CPU reference). One query row and head at a time: the
// proximal logits with the layer's own query and keys, the distant logits with the distant query and keys
// (kernels/pod_attention.h), each softmax-weighted over the layer's own values, merged by the gate in fp32
// log-sum-exp form.
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/kv_rows.h"
#include "kernels/cpu/pod_ops.h"
#include "kernels/cpu/thread_pool.h"

namespace strata::cpu {
namespace {

float dot(const float* a, const float* b, int n) {
  float acc = 0.0f;
  for (int i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

// Row `offset` of full-precision block `id` as fp32: in place in an fp32 pool, widened into `buffer` otherwise.
const float* row_of(const KvPoolView& pool, int32_t id, int64_t offset, float* buffer) {
  if (kv_rows_are_f32(pool)) return pool.block_f32(id) + offset;
  read_kv_rows(pool, id, offset, pool.layout.head_dim, buffer);
  return buffer;
}

const float* key_of(const KvPoolView& pool, std::span<const int32_t> table, int kv_head, int entry, float* buffer) {
  const KvBlockLayout& L = pool.layout;
  const int32_t id = table[size_t(entry / L.block_size)];
  if (pod_is_paired(id) || pool.is_quantized(id)) {
    throw std::logic_error("pod attention: entry " + std::to_string(entry) + " has no full-precision key");
  }
  return row_of(pool, id, L.k_offset(kv_head, entry % L.block_size), buffer);
}

// A paired id's values sit in the key region of its block (kernels/pod_attention.h).
const float* value_of(const KvPoolView& pool, std::span<const int32_t> table, int kv_head, int entry,
                      float* buffer) {
  const KvBlockLayout& L = pool.layout;
  const int32_t id = table[size_t(entry / L.block_size)];
  const int slot = entry % L.block_size;
  if (pod_is_paired(id)) return row_of(pool, pod_paired_block(id), L.k_offset(kv_head, slot), buffer);
  if (pool.is_quantized(id)) throw std::logic_error("pod attention: quantized blocks are not supported");
  return row_of(pool, id, L.v_offset(kv_head, slot), buffer);
}

// o = softmax(logits) · V over `entries`, returning the log-sum-exp (-inf for no entries).
float softmax_values(std::vector<float>& logits, const std::vector<int>& entries, const KvPoolView& pool,
                     std::span<const int32_t> table, int kv_head, float* o) {
  const int hd = pool.layout.head_dim;
  std::vector<float> buffer(static_cast<size_t>(hd));
  std::fill(o, o + hd, 0.0f);
  if (entries.empty()) return -std::numeric_limits<float>::infinity();
  const float max_logit = *std::max_element(logits.begin(), logits.end());
  float sum = 0.0f;
  for (float& a : logits) {
    a = std::exp(a - max_logit);
    sum += a;
  }
  for (size_t j = 0; j < entries.size(); ++j) {
    const float p = logits[j] / sum;
    const float* v = value_of(pool, table, kv_head, entries[j], buffer.data());
    for (int d = 0; d < hd; ++d) o[d] += p * v[d];
  }
  return max_logit + std::log(sum);
}

}  // namespace

void pod_attention(const float* q, std::span<const AttentionSequence> seqs, std::span<const PodDistant> distant,
                   const KvPoolView& pool, int n_heads, float scale, const PodWindow& window, float* out) {
  const KvBlockLayout& L = pool.layout;
  const int hd = L.head_dim;
  const int group = n_heads / L.n_kv_heads;
  const int64_t q_row = int64_t(n_heads) * hd;
  require_kv_element_type(pool, "pod attention");
  if (distant.size() != seqs.size()) throw std::invalid_argument("pod attention: one PodDistant per sequence");
  struct Item {
    int seq, head, row;
  };
  std::vector<Item> items;
  for (int s = 0; s < int(seqs.size()); ++s) {
    if (int(distant[size_t(s)].key_tables.size()) != L.n_kv_heads ||
        int(distant[size_t(s)].queries.size()) != L.n_kv_heads) {
      throw std::invalid_argument("pod attention: distant keys and queries for every KV head");
    }
    for (int h = 0; h < n_heads; ++h) {
      for (int i = 0; i < seqs[size_t(s)].n_q; ++i) items.push_back({s, h, i});
    }
  }

  parallel_for(int64_t(items.size()), 16, [&](int64_t begin, int64_t end) {
    std::vector<float> logits_p, logits_d, o_d = std::vector<float>(size_t(hd));
    std::vector<float> key(static_cast<size_t>(hd));
    std::vector<int> entries_p, entries_d;
    for (size_t it = size_t(begin); it < size_t(end); ++it) {
      const Item& item = items[it];
      const AttentionSequence& s = seqs[size_t(item.seq)];
      const PodDistant& dist = distant[size_t(item.seq)];
      const int kv_head = item.head / group;
      const int64_t row = s.q_begin + item.row;
      const float* qv = q + row * q_row + int64_t(item.head) * hd;
      const float* qd = dist.queries[size_t(kv_head)] + row * q_row + int64_t(item.head) * hd;
      const int pos = s.n_ctx_before + item.row;  // the query's own entry
      const int distant_end = pos - window.recent + 1;  // D = [sinks, distant_end)
      entries_p.clear();
      entries_d.clear();
      logits_p.clear();
      logits_d.clear();
      for (int j = 0; j <= pos; ++j) {
        if (j < window.sinks || j >= distant_end) {
          entries_p.push_back(j);
          logits_p.push_back(dot(qv, key_of(pool, s.block_table, kv_head, j, key.data()), hd) * scale);
        } else {
          entries_d.push_back(j);
          logits_d.push_back(
              dot(qd, key_of(pool, dist.key_tables[size_t(kv_head)], kv_head, j, key.data()), hd) * scale);
        }
      }
      float* o = out + row * q_row + int64_t(item.head) * hd;
      const float lse_p = softmax_values(logits_p, entries_p, pool, s.block_table, kv_head, o);
      const float lse_d = softmax_values(logits_d, entries_d, pool, s.block_table, kv_head, o_d.data());
      const float g = pod_gate(lse_p, lse_d);
      for (int d = 0; d < hd; ++d) o[d] = g * o[d] + (1.0f - g) * o_d[size_t(d)];
    }
  });
}

void kv_pair_values(std::span<const int32_t> first, std::span<const int32_t> second, const KvPoolView& pool) {
  const KvBlockLayout& L = pool.layout;
  const int64_t half = int64_t(L.n_kv_heads) * L.block_size * L.head_dim;  // one region: all heads' K (or V)
  for (size_t i = 0; i < first.size(); ++i) {
    if (pool.is_quantized(first[i]) || pool.is_quantized(second[i]) || pod_is_paired(first[i]) ||
        pod_is_paired(second[i])) {
      throw std::logic_error("kv_pair_values: full-precision blocks only");
    }
    move_kv_elements(pool, first[i], 0, second[i], half, half);
  }
}

}  // namespace strata::cpu
