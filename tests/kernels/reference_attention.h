#pragma once
// Backend::paged_attention as kernels/backend.h defines it, in double and plain loops: the reference that the
// optimised CPU op and its CUDA twin are both tested against. Query row q_begin + i of a sequence attends to its
// cache entries [0, n_ctx_before + i] through its block table; query head h reads KV head h / (H / Hkv); scores
// are scale * q . k, softmax over them; the probabilities of rows >= stats_row_begin are what the op adds to
// column_sums. Entries are read from a pool in host memory in each block format of kernels/kv_block_layout.h:
// full precision (f32, or f16 | bf16 widened by tests/kernels/half_reference.h), KIVI-quantized (x = min + code *
// scale) and SpindleKV-coded (K = RoPE(m * C[k_vector], position) with the view's key RoPE table, V = m *
// C[v_vector]).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <stdexcept>
#include <vector>

#include "kernels/backend.h"
#include "kernels/kv_block_layout.h"
#include "tests/kernels/half_reference.h"

namespace strata::test {

// The scale or min stored at byte `offset` of a quantized block (fp16), read with the compiler's _Float16 rather
// than the code under test.
inline double quantized_scale(const uint8_t* block, int64_t offset) {
  _Float16 x;
  std::memcpy(&x, block + offset, sizeof x);
  return double(x);
}

// Channel c of a row of codes: a byte each (int8), two channels a byte, the even one in the low nibble (int4), or
// four (int2).
inline int quantized_code(const uint8_t* row, int c, KvQuant quant) {
  if (quant == KvQuant::int8) return row[c];
  if (quant == KvQuant::int4) return c % 2 == 0 ? row[c / 2] & 0xF : row[c / 2] >> 4;
  return (row[c / 4] >> (2 * (c % 4))) & 0x3;  // int2: four channels a byte, channel 4i in bits 0-1
}

// The key (or value) of (KV head, slot) of quantized block `id`: keys have a scale and min per channel, values per
// 32 channels of the entry.
inline std::vector<double> quantized_entry(const KvPoolView& pool, int32_t id, int kv_head, int slot, bool key) {
  const KvBlockLayout& L = pool.layout;
  const uint8_t* block = pool.block_quantized(id);
  const uint8_t* codes = block + (key ? L.k_codes_offset(kv_head, slot) : L.v_codes_offset(kv_head, slot));
  std::vector<double> x(size_t(L.head_dim));
  for (int c = 0; c < L.head_dim; ++c) {
    const int64_t group = c / kKvQuantGroup;
    const int64_t scale_at = key ? L.k_scale_offset(kv_head) + kKvScaleBytes * c
                                 : L.v_scale_offset(kv_head, slot) + kKvScaleBytes * group;
    const int64_t min_at = key ? L.k_min_offset(kv_head) + kKvScaleBytes * c
                               : L.v_min_offset(kv_head, slot) + kKvScaleBytes * group;
    x[size_t(c)] =
        quantized_scale(block, min_at) + quantized_code(codes, c, L.quant) * quantized_scale(block, scale_at);
  }
  return x;
}

// The key (or value) of (KV head, slot) of coded block `id`.
inline std::vector<double> coded_entry(const KvPoolView& pool, int32_t id, int kv_head, int slot, bool key) {
  const int hd = pool.layout.head_dim;
  const KvCodeRow& row = pool.block_coded(id)[pool.layout.code_row_index(kv_head, slot)];
  const float* vector = pool.codebook_vector(key ? row.k_vector : row.v_vector);
  const double magnitude = key ? row.k_magnitude : row.v_magnitude;
  std::vector<double> x(static_cast<size_t>(hd));
  for (int d = 0; d < hd; ++d) x[size_t(d)] = magnitude * vector[d];
  if (!key) return x;
  const KvKeyRope& rope = pool.key_rope;
  if (rope.table == nullptr || row.position < 0 || row.position >= rope.n_positions) {
    throw std::logic_error("reference attention: a coded key without its RoPE angle");
  }
  const float* angle = rope.table + int64_t(row.position) * hd;  // hd / 2 cosines, then hd / 2 sines
  std::vector<double> rotated = x;
  for (int i = 0; i < hd / 2; ++i) {
    const int a = rope.style == RopeStyle::interleaved ? 2 * i : i;
    const int b = rope.style == RopeStyle::interleaved ? 2 * i + 1 : i + hd / 2;
    rotated[size_t(a)] = x[size_t(a)] * angle[i] - x[size_t(b)] * angle[hd / 2 + i];
    rotated[size_t(b)] = x[size_t(b)] * angle[i] + x[size_t(a)] * angle[hd / 2 + i];
  }
  return rotated;
}

// The key (or value) of cache entry `entry` of a block table in KV head `kv_head`, whatever its block's format.
inline std::vector<double> reference_entry(const KvPoolView& pool, std::span<const int32_t> table, int kv_head,
                                           int entry, bool key) {
  const KvBlockLayout& L = pool.layout;
  const int32_t id = table[size_t(entry / L.block_size)];
  const int slot = entry % L.block_size;
  if (pool.is_quantized(id)) return quantized_entry(pool, id, kv_head, slot, key);
  if (pool.is_coded(id)) return coded_entry(pool, id, kv_head, slot, key);
  const int64_t offset = key ? L.k_offset(kv_head, slot) : L.v_offset(kv_head, slot);
  if (L.dtype == DType::f32) {
    const float* x = pool.block_f32(id) + offset;
    return std::vector<double>(x, x + L.head_dim);
  }
  const uint8_t* row = static_cast<const uint8_t*>(pool.base) + id * L.block_bytes() + 2 * offset;
  std::vector<double> x(static_cast<size_t>(L.head_dim));
  for (int d = 0; d < L.head_dim; ++d) {
    uint16_t bits;
    std::memcpy(&bits, row + 2 * d, sizeof bits);
    x[size_t(d)] = widen_half(bits, L.dtype);
  }
  return x;
}

// KVzip's statistic of one row's probabilities p: renormalized over [0, sinks) and [from, n), the largest kept.
inline void add_maxima(const ColumnMaxima& range, const std::vector<double>& p, double* maxima) {
  const int n = int(p.size());
  auto in_range = [&](int e) { return e < range.sinks || e >= range.from; };
  double mass = 0.0;
  for (int e = 0; e < n; ++e) mass += in_range(e) ? p[size_t(e)] : 0.0;
  for (int e = 0; e < n; ++e) {
    if (in_range(e)) maxima[e] = std::max(maxima[e], p[size_t(e)] / mass);
  }
}

struct ReferenceAttention {
  std::vector<double> out;  // [T, H * Dh]
  // Per sequence, [H][sums_stride]: what the op adds to its column_sums (empty for a sequence without them), or
  // with column_maxima the largest renormalized probability of each entry (0 for entries outside them).
  std::vector<std::vector<double>> column_sums;
};

// q [T, H * Dh] in host memory; `pool` a view in host memory. The sequences' column_sums are not touched.
inline ReferenceAttention reference_paged_attention(std::span<const float> q, std::span<const AttentionSequence> seqs,
                                                    const KvPoolView& pool, int n_heads, double scale) {
  const int hd = pool.layout.head_dim, group = n_heads / pool.layout.n_kv_heads;
  const int64_t q_row = int64_t(n_heads) * hd;
  ReferenceAttention r{std::vector<double>(q.size(), 0.0), std::vector<std::vector<double>>(seqs.size())};
  for (size_t s = 0; s < seqs.size(); ++s) {
    const AttentionSequence& seq = seqs[s];
    if (seq.column_sums) r.column_sums[s].assign(size_t(n_heads) * size_t(seq.sums_stride), 0.0);
    for (int i = 0; i < seq.n_q; ++i) {
      const int n_keys = seq.n_ctx_before + i + 1;
      for (int h = 0; h < n_heads; ++h) {
        const float* qv = q.data() + int64_t(seq.q_begin + i) * q_row + int64_t(h) * hd;
        std::vector<double> p(static_cast<size_t>(n_keys), 0.0);
        for (int e = 0; e < n_keys; ++e) {
          const std::vector<double> k = reference_entry(pool, seq.block_table, h / group, e, true);
          for (int d = 0; d < hd; ++d) p[size_t(e)] += qv[d] * k[size_t(d)];
          p[size_t(e)] *= scale;
        }
        const double max_score = *std::max_element(p.begin(), p.end());
        double sum = 0.0;
        for (double& x : p) sum += (x = std::exp(x - max_score));
        double* o = r.out.data() + int64_t(seq.q_begin + i) * q_row + int64_t(h) * hd;
        for (double& x : p) x /= sum;
        if (seq.column_sums && seq.column_maxima && i >= seq.stats_row_begin) {
          add_maxima(*seq.column_maxima, p, r.column_sums[s].data() + size_t(h) * size_t(seq.sums_stride));
        }
        for (int e = 0; e < n_keys; ++e) {
          const std::vector<double> v = reference_entry(pool, seq.block_table, h / group, e, false);
          for (int d = 0; d < hd; ++d) o[d] += p[size_t(e)] * v[size_t(d)];
          if (seq.column_sums && !seq.column_maxima && i >= seq.stats_row_begin) {
            r.column_sums[s][size_t(h) * size_t(seq.sums_stride) + size_t(e)] += p[size_t(e)];
          }
        }
      }
    }
  }
  return r;
}

}  // namespace strata::test
