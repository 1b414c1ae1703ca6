// Compaction of a layer's cache after a policy's selection (CPU reference): entry kept[j] moves to entry j.
// A full-precision layer moves entries in place. A layer that starts with quantized blocks keeps
// compacted_quantized_blocks() of them (kernels/kv_block_layout.h), the rest of the kept entries goes to the
// full-precision blocks after them:
// - groups before the first moved entry stay as they are;
// - values keep their codes and per-token scales when they stay quantized, are dequantized when they land in a
//   full-precision block, and are quantized when a full-precision value lands in a quantized group;
// - keys are grouped per channel over the 32 entries of a group, so a group whose entries change is rebuilt from
//   its entries' dequantized keys: that second rounding is the only error compaction adds.
// Work: O(entries from the first moved one) per KV head; scratch of that many keys and values.
#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/kv_quantization.h"
#include "kernels/cpu/kv_rows.h"

namespace strata::cpu {
namespace {

void compact_full_precision(std::span<const int32_t> block_table, std::span<const int32_t> kept,
                            const KvPoolView& pool, int h_begin, int h_end) {
  const KvBlockLayout& L = pool.layout;
  for (size_t j = 0; j < kept.size(); ++j) {
    const int from = kept[j];
    if (from == int(j)) continue;
    const int32_t src = block_table[from / L.block_size], dst = block_table[j / L.block_size];
    const int from_slot = from % L.block_size, to_slot = int(j) % L.block_size;
    for (int h = h_begin; h < h_end; ++h) {
      move_kv_elements(pool, dst, L.k_offset(h, to_slot), src, L.k_offset(h, from_slot), L.head_dim);
      move_kv_elements(pool, dst, L.v_offset(h, to_slot), src, L.v_offset(h, from_slot), L.head_dim);
    }
  }
}

// The kept entries from `first` on, read out of the layer before anything is written back (the destination
// blocks are the source blocks). Keys as floats; values as floats, or with their codes in a scratch of
// quantized-format blocks when they were quantized.
struct GatheredEntries {
  int first = 0;
  std::vector<float> keys;             // [n][head_dim]
  std::vector<float> values;           // [n][head_dim], for values that were full precision
  std::vector<uint8_t> quantized;      // quantized blocks: entry first + i at block i / 32, slot i % 32
  std::vector<bool> value_quantized;   // [n]
};

GatheredEntries gather(std::span<const int32_t> table, std::span<const int32_t> kept, int first,
                       const KvPoolView& pool, int head) {
  const KvBlockLayout& L = pool.layout;
  const int n = int(kept.size()) - first;
  GatheredEntries g;
  g.first = first;
  g.keys.resize(size_t(n) * L.head_dim);
  g.values.resize(size_t(n) * L.head_dim);
  g.quantized.resize(size_t((n + L.block_size - 1) / L.block_size) * size_t(L.quantized_block_bytes()));
  g.value_quantized.resize(size_t(n));
  for (int i = 0; i < n; ++i) {
    const int e = kept[size_t(first + i)];
    const int32_t block = table[size_t(e / L.block_size)];
    const int slot = e % L.block_size;
    float* key = g.keys.data() + size_t(i) * L.head_dim;
    if (pool.is_quantized(block)) {
      const uint8_t* q = pool.block_quantized(block);
      dequantize_keys(q, head, slot, 1, L, key);
      uint8_t* scratch = g.quantized.data() + size_t(i / L.block_size) * size_t(L.quantized_block_bytes());
      copy_value_entry(q, slot, scratch, i % L.block_size, head, L);
      g.value_quantized[size_t(i)] = true;
    } else {
      read_kv_rows(pool, block, L.k_offset(head, slot), L.head_dim, key);
      read_kv_rows(pool, block, L.v_offset(head, slot), L.head_dim, g.values.data() + size_t(i) * L.head_dim);
    }
  }
  return g;
}

void compact_quantized_head(std::span<const int32_t> table, std::span<const int32_t> kept, const KvPoolView& pool,
                            int head, int n_quantized) {
  const KvBlockLayout& L = pool.layout;
  const int bs = L.block_size;
  const int n_kept = int(kept.size());
  const int kept_quantized = compacted_quantized_blocks(n_quantized, n_kept);
  int unmoved = 0;  // entries [0, unmoved) stay where they are
  while (unmoved < n_kept && kept[size_t(unmoved)] == unmoved) ++unmoved;
  // Quantized groups wholly before the first moved entry are untouched; so are full-precision entries before it
  // when the full-precision region does not move (it moves when quantized groups are given up).
  const int first_group = std::min(unmoved / bs, kept_quantized);
  const int first_full = kept_quantized == n_quantized ? std::max(unmoved, kept_quantized * bs) : kept_quantized * bs;
  const int first = std::min(first_group * bs, first_full);
  if (first >= n_kept) return;
  const GatheredEntries g = gather(table, kept, first, pool, head);
  auto scratch_block = [&](int j) {
    return g.quantized.data() + size_t((j - first) / bs) * size_t(L.quantized_block_bytes());
  };

  std::vector<float> group_keys(size_t(bs) * L.head_dim), value(size_t(L.head_dim));
  for (int group = first_group; group < kept_quantized; ++group) {
    uint8_t* block = pool.block_quantized(table[size_t(group)]);
    for (int t = 0; t < bs; ++t) {
      const int j = group * bs + t;
      std::memcpy(group_keys.data() + size_t(t) * L.head_dim, g.keys.data() + size_t(j - first) * L.head_dim,
                  sizeof(float) * L.head_dim);
      if (g.value_quantized[size_t(j - first)]) {
        copy_value_entry(scratch_block(j), (j - first) % bs, block, t, head, L);
      } else {
        quantize_value_row(g.values.data() + size_t(j - first) * L.head_dim, block, head, t, L);
      }
    }
    quantize_keys(group_keys.data(), L.head_dim, block, head, L);
  }
  for (int j = first_full; j < n_kept; ++j) {
    const int index = j - kept_quantized * bs;  // among the full-precision entries
    const int32_t block = table[size_t(n_quantized + index / bs)];
    write_kv_rows(pool, block, L.k_offset(head, index % bs), g.keys.data() + size_t(j - first) * L.head_dim,
                  L.head_dim);
    const float* v = g.values.data() + size_t(j - first) * L.head_dim;
    if (g.value_quantized[size_t(j - first)]) {
      dequantize_values(scratch_block(j), head, (j - first) % bs, 1, L, value.data());
      v = value.data();
    }
    write_kv_rows(pool, block, L.v_offset(head, index % bs), v, L.head_dim);
  }
}

}  // namespace

void kv_compact(std::span<const int32_t> block_table, std::span<const int32_t> kept, const KvPoolView& pool,
                int head) {
  const KvBlockLayout& L = pool.layout;
  require_kv_element_type(pool, "kv_compact");
  const int h_begin = head < 0 ? 0 : head, h_end = head < 0 ? L.n_kv_heads : head + 1;
  int n_quantized = 0;
  while (n_quantized < int(block_table.size()) && pool.is_quantized(block_table[size_t(n_quantized)])) ++n_quantized;
  if (n_quantized == 0) return compact_full_precision(block_table, kept, pool, h_begin, h_end);

  for (size_t b = size_t(n_quantized); b < block_table.size(); ++b) {
    if (pool.is_quantized(block_table[b])) {
      throw std::invalid_argument("kv_compact: quantized blocks must come before the full-precision ones");
    }
  }
  const int kept_quantized = compacted_quantized_blocks(n_quantized, int(kept.size()));
  const int n_full = int(kept.size()) - kept_quantized * L.block_size;
  if ((n_full + L.block_size - 1) / L.block_size > int(block_table.size()) - n_quantized) {
    throw std::invalid_argument("kv_compact: " + std::to_string(n_full) +
                                " kept entries need more full-precision blocks than the table has after its " +
                                std::to_string(n_quantized) + " quantized ones");
  }
  for (int h = h_begin; h < h_end; ++h) compact_quantized_head(block_table, kept, pool, h, n_quantized);
}

}  // namespace strata::cpu
