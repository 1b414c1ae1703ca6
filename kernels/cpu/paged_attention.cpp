// Causal attention over the paged KV cache, and the write of new keys and values into it (CPU reference).
// One code path serves prefill chunks and decode steps: query i of a sequence sees cache entries
// [0, n_ctx_before + i]. Entries are in cache order, which is also causal order, also after compression
// (policies only remove entries; new ones are always appended).
//
// Quantized blocks (kernels/kv_block_layout.h) are dequantized as they are read, folded into the arithmetic as
// KIVI's kernels do: q . (min + code * scale) = (q * scale) . code + q . min for a key (per-channel scale and min),
// and p * (min + code * scale) = (p * scale) * code + p * min for a value (per-token, per 32 channels).
// Coded blocks (SpindleKV) are reconstructed as they are read: K = RoPE(m * C[r], position), V = m * C[r].
#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/kv_codebook_ops.h"
#include "kernels/cpu/kv_quantization.h"

namespace strata::cpu {

void kv_write(const float* k, const float* v, std::span<const AttentionSequence> seqs, const KvPoolView& pool) {
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
      float* block = pool.block_f32(id);
      const int slot = entry % L.block_size;
      const int64_t src = int64_t(s.q_begin + i) * row;
      for (int h = 0; h < L.n_kv_heads; ++h) {
        std::memcpy(block + L.k_offset(h, slot), k + src + int64_t(h) * L.head_dim, sizeof(float) * L.head_dim);
        std::memcpy(block + L.v_offset(h, slot), v + src + int64_t(h) * L.head_dim, sizeof(float) * L.head_dim);
      }
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

// Per-thread buffers for reading quantized blocks.
struct QuantScratch {
  std::vector<float> scaled_q;  // [head_dim]: q * key scale
  std::vector<float> codes;     // [head_dim]: one entry's codes
};

// scores[j] = scale * q . k_j for the first n entries of one block.
void block_scores(const float* qv, const KvPoolView& pool, int32_t id, int kv_head, int n, float scale,
                  QuantScratch& scratch, float* scores) {
  const KvBlockLayout& L = pool.layout;
  const int hd = L.head_dim;
  if (pool.is_coded(id)) {
    const KvCodeRow* rows = pool.block_coded(id) + L.code_row_index(kv_head, 0);
    for (int j = 0; j < n; ++j) {
      coded_key(pool, rows[j], scratch.codes.data());
      scores[j] = dot(qv, scratch.codes.data(), hd) * scale;
    }
    return;
  }
  if (!pool.is_quantized(id)) {
    const float* block = pool.block_f32(id);
    for (int j = 0; j < n; ++j) scores[j] = dot(qv, block + L.k_offset(kv_head, j), hd) * scale;
    return;
  }
  const uint8_t* block = pool.block_quantized(id);
  const float* k_scale = reinterpret_cast<const float*>(block + L.k_scale_offset(kv_head));
  const float* k_min = reinterpret_cast<const float*>(block + L.k_min_offset(kv_head));
  for (int c = 0; c < hd; ++c) scratch.scaled_q[size_t(c)] = qv[c] * k_scale[c];
  const float bias = dot(qv, k_min, hd);
  for (int j = 0; j < n; ++j) {
    unpack_codes(block + L.k_codes_offset(kv_head, j), L, scratch.codes.data());
    scores[j] = (dot(scratch.scaled_q.data(), scratch.codes.data(), hd) + bias) * scale;
  }
}

// o += sum_j p[j] * v_j over the first n entries of one block.
void block_values(const float* p, const KvPoolView& pool, int32_t id, int kv_head, int n, QuantScratch& scratch,
                  float* o) {
  const KvBlockLayout& L = pool.layout;
  const int hd = L.head_dim;
  if (pool.is_coded(id)) {
    const KvCodeRow* rows = pool.block_coded(id) + L.code_row_index(kv_head, 0);
    for (int j = 0; j < n; ++j) {
      const float a = p[j] * rows[j].v_magnitude;
      const float* c = pool.codebook_vector(rows[j].v_vector);
      for (int d = 0; d < hd; ++d) o[d] += a * c[d];
    }
    return;
  }
  if (!pool.is_quantized(id)) {
    const float* block = pool.block_f32(id);
    for (int j = 0; j < n; ++j) {
      const float* vv = block + L.v_offset(kv_head, j);
      for (int d = 0; d < hd; ++d) o[d] += p[j] * vv[d];
    }
    return;
  }
  const uint8_t* block = pool.block_quantized(id);
  for (int j = 0; j < n; ++j) {
    const float* v_scale = reinterpret_cast<const float*>(block + L.v_scale_offset(kv_head, j));
    const float* v_min = reinterpret_cast<const float*>(block + L.v_min_offset(kv_head, j));
    unpack_codes(block + L.v_codes_offset(kv_head, j), L, scratch.codes.data());
    for (int g = 0; g < L.v_groups(); ++g) {
      const float a = p[j] * v_scale[g], b = p[j] * v_min[g];
      const float* code = scratch.codes.data() + g * kKvQuantGroup;
      float* out = o + g * kKvQuantGroup;
      for (int d = 0; d < kKvQuantGroup; ++d) out[d] += a * code[d] + b;
    }
  }
}

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
    QuantScratch scratch{std::vector<float>(size_t(hd)), std::vector<float>(size_t(hd))};
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

        for (int e0 = 0; e0 < n_keys; e0 += L.block_size) {
          block_scores(qv, pool, s.block_table[e0 / L.block_size], kv_head, std::min(L.block_size, n_keys - e0),
                       scale, scratch, scores.data() + e0);
        }
        const float max_score = *std::max_element(scores.begin(), scores.end());
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
          block_values(scores.data() + e0, pool, s.block_table[e0 / L.block_size], kv_head,
                       std::min(L.block_size, n_keys - e0), scratch, o);
        }
      }
    }
  }
}

}  // namespace strata::cpu
