#include "cache/kv_cache.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <unordered_map>

namespace strata {

KvCache::KvCache(BlockPool& pool, int layer_begin, int layer_end)
    : pool_(pool), layer_begin_(layer_begin), layer_end_(layer_end) {
  if (layer_end <= layer_begin) throw std::invalid_argument("kv cache: empty layer range");
  counts_.resize(size_t(n_layers()));
}

KvCache::~KvCache() {
  while (!seqs_.empty()) release(seqs_.begin()->first);
}

static int64_t blocks_for(int64_t entries, int block_size) { return (entries + block_size - 1) / block_size; }

// Entries and blocks after a layer's quantized ones.
static int64_t full_entries(const LayerKv& kv, int block_size) {
  return kv.n_entries - int64_t(kv.n_quantized_blocks) * block_size;
}
static int64_t full_blocks(const LayerKv& kv) { return int64_t(kv.block_table.size()) - kv.n_quantized_blocks; }

int64_t KvCache::blocks_to_append(SeqId seq, int n_new) const {
  auto it = seqs_.find(seq);
  int64_t total = 0;
  for (int l = 0; l < n_layers(); ++l) {
    if (it == seqs_.end()) {
      total += blocks_for(n_new, block_size());
      continue;
    }
    const LayerKv& kv = it->second[size_t(l)];
    total += std::max<int64_t>(0, blocks_for(full_entries(kv, block_size()) + n_new, block_size()) - full_blocks(kv));
  }
  return total;
}

int64_t KvCache::blocks_held(SeqId seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return 0;
  int64_t total = 0;
  std::unordered_map<int32_t, int> per_slab;  // quantized blocks of seq in each slab
  for (const LayerKv& l : it->second) {
    total += full_blocks(l) - l.n_paired;
    for (int i = 0; i < l.n_quantized_blocks; ++i) ++per_slab[pool_.slot_of(l.block_table[size_t(i)])];
  }
  for (const auto& [slot, n] : per_slab) total += n == pool_.slab_used(slot) ? 1 : 0;
  return total;
}

const LayerKv& KvCache::layer(SeqId seq, int global_layer) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) throw std::out_of_range("kv cache: unknown sequence " + std::to_string(seq));
  if (global_layer < layer_begin_ || global_layer >= layer_end_) {
    throw std::out_of_range("kv cache: layer " + std::to_string(global_layer) + " is not held by this rank");
  }
  return it->second[size_t(global_layer - layer_begin_)];
}

LayerKv& KvCache::layer_mut(SeqId seq, int global_layer) { return const_cast<LayerKv&>(layer(seq, global_layer)); }

LayerUsage KvCache::layer_usage(int global_layer) const {
  const LayerCounts& c = counts_.at(size_t(global_layer - layer_begin_));
  LayerUsage u;
  u.entries = c.entries;
  u.blocks = c.full_blocks + c.quantized_blocks;
  u.quantized_blocks = c.quantized_blocks;
  u.bytes = c.full_blocks * pool_.layout().block_bytes() + c.quantized_blocks * pool_.quantized_block_bytes();
  u.uncompressed_bytes = c.uncompressed_blocks * pool_.layout().block_bytes();
  return u;
}

LayerUsage KvCache::sequence_usage(SeqId seq, int global_layer) const {
  const LayerKv& kv = layer(seq, global_layer);
  LayerUsage u;
  u.entries = kv.n_entries;
  u.blocks = int64_t(kv.block_table.size()) - kv.n_paired;
  u.quantized_blocks = kv.n_quantized_blocks;
  u.bytes = (u.blocks - u.quantized_blocks) * pool_.layout().block_bytes() +
            u.quantized_blocks * pool_.quantized_block_bytes();
  u.uncompressed_bytes = blocks_for(kv.n_appended, block_size()) * pool_.layout().block_bytes();
  return u;
}

void KvCache::account(int l, const LayerCounts& d) {
  LayerCounts& c = counts_[size_t(l)];
  c.entries += d.entries;
  c.full_blocks += d.full_blocks;
  c.quantized_blocks += d.quantized_blocks;
  c.uncompressed_blocks += d.uncompressed_blocks;
}

void KvCache::append(SeqId seq, int n_new) {
  if (n_new < 0) throw std::invalid_argument("kv cache: negative append");
  if (!can_append(seq, n_new)) throw std::runtime_error("kv cache: not enough free blocks to append");
  auto [it, inserted] = seqs_.try_emplace(seq);
  if (inserted) it->second.resize(size_t(n_layers()));
  for (int l = 0; l < n_layers(); ++l) {
    LayerKv& kv = it->second[size_t(l)];
    const int64_t need = blocks_for(full_entries(kv, block_size()) + n_new, block_size());
    int64_t added = 0;
    while (full_blocks(kv) < need) {
      kv.block_table.push_back(pool_.allocate());
      ++added;
    }
    const int64_t uncompressed_added =
        blocks_for(kv.n_appended + n_new, block_size()) - blocks_for(kv.n_appended, block_size());
    kv.n_entries += n_new;
    kv.n_appended += n_new;
    account(l, {n_new, added, 0, uncompressed_added});
  }
}

void KvCache::retain(SeqId seq, int global_layer, std::span<const int32_t> kept) {
  const std::vector<int32_t> one(kept.begin(), kept.end());
  retain(seq, global_layer, std::span<const std::vector<int32_t>>(&one, 1));
}

void KvCache::retain(SeqId seq, int global_layer, std::span<const std::vector<int32_t>> kept_per_head) {
  LayerKv& kv = layer_mut(seq, global_layer);
  const int n_heads = pool_.layout().n_kv_heads;
  if (kept_per_head.empty() || (kept_per_head.size() != 1 && int(kept_per_head.size()) != n_heads)) {
    throw std::invalid_argument("kv cache: a selection has one list, or one per KV head (" + std::to_string(n_heads) +
                                "), not " + std::to_string(kept_per_head.size()));
  }
  if (kv.n_paired > 0) throw std::logic_error("kv cache: a layer with paired PoD blocks cannot be compacted");
  const size_t n_kept = kept_per_head[0].size();
  for (const std::vector<int32_t>& kept : kept_per_head) {
    if (kept.size() != n_kept) throw std::invalid_argument("kv cache: every KV head must keep as many entries");
    for (size_t j = 0; j < kept.size(); ++j) {
      if (kept[j] < 0 || kept[j] >= kv.n_entries || (j > 0 && kept[j] <= kept[j - 1])) {
        throw std::invalid_argument("kv cache: retained entries must be ascending indices of held entries");
      }
    }
  }
  // The layout after compaction (kernels/kv_block_layout.h): the quantized blocks that the kept entries fill,
  // then full-precision blocks for the rest.
  const int kept_quantized = compacted_quantized_blocks(kv.n_quantized_blocks, int(n_kept));
  const int64_t full_need = blocks_for(int64_t(n_kept) - int64_t(kept_quantized) * block_size(), block_size());
  const int l = global_layer - layer_begin_;
  if (full_need > full_blocks(kv)) {
    // Only when quantized groups are given up and the layer has no full-precision block: never at a policy hook,
    // which follows a step that wrote at least one entry. A compaction frees memory overall, so it may take the
    // pool's reserve.
    kv.block_table.push_back(pool_.allocate(/*use_reserve=*/true));
    account(l, {0, 1, 0, 0});
  }
  if (kept_per_head.size() == 1) {
    pool_.backend().kv_compact(kv.block_table, kept_per_head[0], pool_.view(), -1);
  } else {
    for (int h = 0; h < n_heads; ++h) pool_.backend().kv_compact(kv.block_table, kept_per_head[size_t(h)], pool_.view(), h);
  }
  // Give back the quantized blocks after the kept ones, and the full-precision blocks past the need.
  const int64_t freed_quantized = kv.n_quantized_blocks - kept_quantized;
  for (int i = kept_quantized; i < kv.n_quantized_blocks; ++i) pool_.release(kv.block_table[size_t(i)]);
  kv.block_table.erase(kv.block_table.begin() + kept_quantized, kv.block_table.begin() + kv.n_quantized_blocks);
  kv.n_quantized_blocks = kept_quantized;
  int64_t freed_full = 0;
  while (full_blocks(kv) > full_need) {
    pool_.release(kv.block_table.back());
    kv.block_table.pop_back();
    ++freed_full;
  }
  account(l, {int64_t(n_kept) - kv.n_entries, -freed_full, -freed_quantized, 0});
  kv.n_entries = int32_t(n_kept);
}

int KvCache::seal(SeqId seq, int global_layer) {
  if (!pool_.quantized()) return 0;
  LayerKv& kv = layer_mut(seq, global_layer);
  const int l = global_layer - layer_begin_;
  int sealed = 0;
  std::vector<int32_t> src, dst;
  for (;;) {
    // Each full group is one whole full-precision block: the region starts at a block boundary.
    const int64_t groups = full_entries(kv, block_size()) / block_size();
    src.clear();
    dst.clear();
    for (int64_t g = 0; g < groups && pool_.can_allocate_quantized(); ++g) {
      dst.push_back(pool_.allocate_quantized());
      src.push_back(kv.block_table[size_t(kv.n_quantized_blocks + g)]);
    }
    if (dst.empty()) return sealed;
    pool_.backend().kv_quantize(src, dst, pool_.view());
    for (size_t i = 0; i < src.size(); ++i) {
      kv.block_table[size_t(kv.n_quantized_blocks) + i] = dst[i];
      pool_.release(src[i]);  // frees its slot for the next quantized blocks
    }
    kv.n_quantized_blocks += int32_t(src.size());
    sealed += int(src.size());
    account(l, {0, -int64_t(src.size()), int64_t(src.size()), 0});
  }
}

int KvCache::pair_key_free_blocks(SeqId seq, int global_layer, int entry_begin, int entry_end) {
  LayerKv& kv = layer_mut(seq, global_layer);
  const int bs = block_size();
  std::vector<int32_t> first, second;
  std::vector<size_t> at;
  for (int b = std::max(int(kv.n_quantized_blocks), (entry_begin + bs - 1) / bs); (b + 2) * bs <= entry_end;) {
    const int32_t x = kv.block_table[size_t(b)], y = kv.block_table[size_t(b) + 1];
    if (pod_is_paired(y)) {  // paired at an earlier call
      b += 2;
      continue;
    }
    first.push_back(x);
    second.push_back(y);
    at.push_back(size_t(b) + 1);
    b += 2;
  }
  if (first.empty()) return 0;
  pool_.backend().kv_pair_values(first, second, pool_.view());
  for (size_t i = 0; i < first.size(); ++i) {
    kv.block_table[at[i]] = pod_paired_id(first[i]);
    pool_.release(second[i]);
  }
  kv.n_paired += int32_t(first.size());
  account(global_layer - layer_begin_, {0, -int64_t(first.size()), 0, 0});
  return int(first.size());
}

void KvCache::release(SeqId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  for (int l = 0; l < n_layers(); ++l) {
    LayerKv& kv = it->second[size_t(l)];
    for (int32_t b : kv.block_table) {
      if (!pod_is_paired(b)) pool_.release(b);
    }
    account(l, {-kv.n_entries, -(full_blocks(kv) - kv.n_paired), -int64_t(kv.n_quantized_blocks),
                -blocks_for(kv.n_appended, block_size())});
  }
  seqs_.erase(it);
}

}  // namespace strata
