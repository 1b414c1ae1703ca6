// SpindleKV's codebook ops, CPU reference (kernels/kv_codebook.h; ../shared/specs/spindlekv.md sections 4 and 5).
// Everything in fp32. The greedy build keeps the adjacency as one byte per pair and maintains degrees as groups
// are removed, so the whole build is O(N^2 * head_dim) for the cosines plus O(N^2) for the loop (spec 4, costs).
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/kv_codebook_ops.h"
#include "kernels/cpu/kv_rows.h"
#include "kernels/cpu/thread_pool.h"

namespace strata {

void key_rope_table(int head_dim, const RopeParams& rope, int n_positions, float* table) {
  const int half = head_dim / 2;
  std::vector<float> inv_freq(static_cast<size_t>(half));
  cpu::rope_inv_freq(head_dim, rope, inv_freq.data());
  for (int p = 0; p < n_positions; ++p) {
    float* row = table + int64_t(p) * head_dim;
    for (int i = 0; i < half; ++i) {
      const float angle = float(p) * inv_freq[size_t(i)];  // as kernels/cpu/rope.cpp computes it
      row[i] = float(std::cos(double(angle)));
      row[half + i] = float(std::sin(double(angle)));
    }
  }
}

namespace cpu {
namespace {

// Rotates x[head_dim] by RoPE at `position` (sign +1) or back (sign -1), in the model's layout.
void rotate(const KvKeyRope& rope, int head_dim, int32_t position, float sign, float* x) {
  if (position < 0 || position >= rope.n_positions) {
    throw std::out_of_range("kv codebook: position " + std::to_string(position) + " outside the key RoPE table (" +
                            std::to_string(rope.n_positions) + " positions)");
  }
  const int half = head_dim / 2;
  const float* row = rope.table + int64_t(position) * head_dim;
  for (int i = 0; i < half; ++i) {
    const int a = rope.style == RopeStyle::interleaved ? 2 * i : i;
    const int b = rope.style == RopeStyle::interleaved ? 2 * i + 1 : i + half;
    const float c = row[i], s = sign * row[half + i];
    const float x0 = x[a], x1 = x[b];
    x[a] = x0 * c - x1 * s;
    x[b] = x1 * c + x0 * s;
  }
}

// The stored vector of (head, entry) from a full-precision block; keys un-rotated to before RoPE.
void read_entry(std::span<const int32_t> table, int head, KvPart part, int entry, int32_t position,
                const KvPoolView& pool, float* out) {
  const KvBlockLayout& L = pool.layout;
  const int32_t id = table[size_t(entry / L.block_size)];
  if (pool.is_quantized(id) || pool.is_coded(id)) {
    throw std::logic_error("kv codebook: entry " + std::to_string(entry) + " is not in a full-precision block");
  }
  const int slot = entry % L.block_size;
  read_kv_rows(pool, id, part == KvPart::key ? L.k_offset(head, slot) : L.v_offset(head, slot), L.head_dim, out);
  if (part == KvPart::key) rotate(pool.key_rope, L.head_dim, position, -1.0f, out);
}

// Normalises x in place and returns its norm; a zero vector stays zero.
float normalise(float* x, int n) {
  double sq = 0.0;
  for (int i = 0; i < n; ++i) sq += double(x[i]) * x[i];
  const float norm = float(std::sqrt(sq));
  if (norm > 0.0f) {
    for (int i = 0; i < n; ++i) x[i] /= norm;
  }
  return norm;
}

float dot(const float* a, const float* b, int n) {
  float acc = 0.0f;
  for (int i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

}  // namespace

void coded_key(const KvPoolView& pool, const KvCodeRow& row, float* out) {
  const int hd = pool.layout.head_dim;
  const float* c = pool.codebook_vector(row.k_vector);
  for (int d = 0; d < hd; ++d) out[d] = row.k_magnitude * c[d];
  rotate(pool.key_rope, hd, row.position, 1.0f, out);
}

int kv_codebook_build(std::span<const int32_t> block_table, int head, KvPart part, std::span<const int32_t> positions,
                      float threshold, const KvPoolView& pool, std::span<int32_t> assignment,
                      std::span<int32_t> centres) {
  const int n = int(positions.size());
  const int hd = pool.layout.head_dim;
  if (int(assignment.size()) != n || int(centres.size()) < n) {
    throw std::invalid_argument("kv_codebook_build: outputs must hold one index per entry");
  }
  std::vector<float> unit(size_t(n) * hd);
  for (int i = 0; i < n; ++i) {
    float* u = unit.data() + int64_t(i) * hd;
    read_entry(block_table, head, part, i, positions[size_t(i)], pool, u);
    normalise(u, hd);
  }
  // G[a][b] = cos(a, b) > threshold, and every entry adjacent to itself (spec 4, step 2).
  std::vector<uint8_t> adjacent(size_t(n) * size_t(n));
  parallel_for(n, n > 64 ? 16 : n, [&](int64_t begin, int64_t end) {
    for (int64_t a = begin; a < end; ++a) {
      for (int b = 0; b < n; ++b) {
        adjacent[size_t(a) * n + b] =
            a == b || dot(unit.data() + a * hd, unit.data() + int64_t(b) * hd, hd) > threshold;
      }
    }
  });
  std::vector<int64_t> degree(size_t(n), 0);
  for (int a = 0; a < n; ++a) {
    for (int b = 0; b < n; ++b) degree[size_t(a)] += adjacent[size_t(a) * n + b];
  }
  std::vector<uint8_t> alive(size_t(n), 1);
  int n_alive = n, n_codes = 0;
  while (n_alive > 0) {
    int centre = -1;
    for (int a = 0; a < n; ++a) {
      if (alive[size_t(a)] && (centre < 0 || degree[size_t(a)] > degree[size_t(centre)])) centre = a;
    }
    // The centre and its remaining neighbours join code n_codes and leave the graph; degrees lose their edges.
    const uint8_t* row = adjacent.data() + size_t(centre) * n;
    for (int b = 0; b < n; ++b) {
      if (!alive[size_t(b)] || !row[b]) continue;
      alive[size_t(b)] = 0;
      --n_alive;
      assignment[size_t(b)] = n_codes;
      for (int a = 0; a < n; ++a) degree[size_t(a)] -= adjacent[size_t(a) * n + b];
    }
    centres[size_t(n_codes++)] = centre;
  }
  return n_codes;
}

void kv_codebook_match(std::span<const int32_t> block_table, int head, KvPart part, std::span<const int32_t> entries,
                       std::span<const int32_t> positions, std::span<const int32_t> codebook, const KvPoolView& pool,
                       std::span<float> best_similarity, std::span<int32_t> best_index) {
  const int hd = pool.layout.head_dim;
  std::vector<float> u(static_cast<size_t>(hd));
  for (size_t i = 0; i < entries.size(); ++i) {
    read_entry(block_table, head, part, entries[i], positions[i], pool, u.data());
    normalise(u.data(), hd);
    float best = -std::numeric_limits<float>::infinity();
    int32_t arg = -1;
    for (size_t c = 0; c < codebook.size(); ++c) {
      const float sim = dot(u.data(), pool.codebook_vector(codebook[c]), hd);
      if (sim > best) {
        best = sim;
        arg = int32_t(c);
      }
    }
    best_similarity[i] = best;
    best_index[i] = arg;
  }
}

void kv_codebook_encode(std::span<const int32_t> block_table, const KvCodebookEncoding& e, const KvPoolView& pool) {
  const KvBlockLayout& L = pool.layout;
  const int hd = L.head_dim;
  const int n = int(e.positions.size());
  if (int(e.k_vectors.size()) != n || int(e.v_vectors.size()) != n) {
    throw std::invalid_argument("kv_codebook_encode: one key and one value vector id per entry");
  }
  auto position_of = [&](int entry) {
    if (entry < e.entry_begin || entry >= e.entry_begin + n) {
      throw std::invalid_argument("kv_codebook_encode: new codebook vector from entry " + std::to_string(entry) +
                                  " outside the encoded entries");
    }
    return e.positions[size_t(entry - e.entry_begin)];
  };
  // New codebook vectors first: they are read from entries that the write-back below may overwrite.
  for (size_t i = 0; i < e.new_k_entries.size(); ++i) {
    float* dst = pool.codebook_vector(e.new_k_vectors[i]);
    read_entry(block_table, e.head, KvPart::key, e.new_k_entries[i], position_of(e.new_k_entries[i]), pool, dst);
    normalise(dst, hd);
  }
  for (size_t i = 0; i < e.new_v_entries.size(); ++i) {
    float* dst = pool.codebook_vector(e.new_v_vectors[i]);
    read_entry(block_table, e.head, KvPart::value, e.new_v_entries[i], position_of(e.new_v_entries[i]), pool, dst);
    normalise(dst, hd);
  }
  std::vector<float> x(static_cast<size_t>(hd));
  require_kv_element_type(pool, "kv_codebook_encode");
  for (int i = 0; i < n; ++i) {
    const int entry = e.entry_begin + i;
    KvCodeRow row{e.k_vectors[size_t(i)], 0.0f, e.v_vectors[size_t(i)], 0.0f, e.positions[size_t(i)]};
    read_entry(block_table, e.head, KvPart::key, entry, row.position, pool, x.data());
    row.k_magnitude = normalise(x.data(), hd);
    read_entry(block_table, e.head, KvPart::value, entry, row.position, pool, x.data());
    row.v_magnitude = normalise(x.data(), hd);
    const size_t block = size_t(entry / L.block_size - e.entry_begin / L.block_size);
    if (block >= e.coded_blocks.size() || !pool.is_coded(e.coded_blocks[block])) {
      throw std::invalid_argument("kv_codebook_encode: no coded block for entry " + std::to_string(entry));
    }
    pool.block_coded(e.coded_blocks[block])[L.code_row_index(e.head, entry % L.block_size)] = row;
    if (entry < e.write_back_from) continue;
    const int32_t block_id = block_table[size_t(entry / L.block_size)];
    const int slot = entry % L.block_size;
    coded_key(pool, row, x.data());
    write_kv_rows(pool, block_id, L.k_offset(e.head, slot), x.data(), hd);
    const float* c = pool.codebook_vector(row.v_vector);
    for (int d = 0; d < hd; ++d) x[size_t(d)] = row.v_magnitude * c[d];
    write_kv_rows(pool, block_id, L.v_offset(e.head, slot), x.data(), hd);
  }
}

}  // namespace cpu
}  // namespace strata
