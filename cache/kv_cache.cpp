#include "cache/kv_cache.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace strata {

KvCache::KvCache(BlockPool& pool, int layer_begin, int layer_end)
    : pool_(pool), layer_begin_(layer_begin), layer_end_(layer_end) {
  if (layer_end <= layer_begin) throw std::invalid_argument("kv cache: empty layer range");
  usage_.resize(size_t(n_layers()));
  uncompressed_blocks_.resize(size_t(n_layers()));
}

KvCache::~KvCache() {
  while (!seqs_.empty()) release(seqs_.begin()->first);
}

static int64_t blocks_for(int64_t entries, int block_size) { return (entries + block_size - 1) / block_size; }

int64_t KvCache::blocks_to_append(SeqId seq, int n_new) const {
  auto it = seqs_.find(seq);
  int64_t total = 0;
  for (int l = 0; l < n_layers(); ++l) {
    const int64_t have = it == seqs_.end() ? 0 : int64_t(it->second[l].block_table.size());
    const int64_t entries = (it == seqs_.end() ? 0 : it->second[l].n_entries) + n_new;
    total += std::max<int64_t>(0, blocks_for(entries, block_size()) - have);
  }
  return total;
}

int64_t KvCache::blocks_held(SeqId seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return 0;
  int64_t total = 0;
  for (const LayerKv& l : it->second) total += int64_t(l.block_table.size());
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
  const int l = global_layer - layer_begin_;
  LayerUsage u = usage_.at(size_t(l));
  u.bytes = u.blocks * pool_.layout().block_bytes();
  u.uncompressed_bytes = uncompressed_blocks_.at(size_t(l)) * pool_.layout().block_bytes();
  return u;
}

void KvCache::account(int l, int64_t d_entries, int64_t d_blocks, int64_t d_uncompressed_blocks) {
  usage_[size_t(l)].entries += d_entries;
  usage_[size_t(l)].blocks += d_blocks;
  uncompressed_blocks_[size_t(l)] += d_uncompressed_blocks;
}

void KvCache::append(SeqId seq, int n_new) {
  if (n_new < 0) throw std::invalid_argument("kv cache: negative append");
  if (!can_append(seq, n_new)) throw std::runtime_error("kv cache: not enough free blocks to append");
  auto [it, inserted] = seqs_.try_emplace(seq);
  if (inserted) it->second.resize(size_t(n_layers()));
  for (int l = 0; l < n_layers(); ++l) {
    LayerKv& kv = it->second[size_t(l)];
    const int64_t need = blocks_for(kv.n_entries + n_new, block_size());
    int64_t added = 0;
    while (int64_t(kv.block_table.size()) < need) {
      kv.block_table.push_back(pool_.allocate());
      ++added;
    }
    const int64_t uncompressed_added =
        blocks_for(kv.n_appended + n_new, block_size()) - blocks_for(kv.n_appended, block_size());
    kv.n_entries += n_new;
    kv.n_appended += n_new;
    account(l, n_new, added, uncompressed_added);
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
  const size_t n_kept = kept_per_head[0].size();
  for (const std::vector<int32_t>& kept : kept_per_head) {
    if (kept.size() != n_kept) throw std::invalid_argument("kv cache: every KV head must keep as many entries");
    for (size_t j = 0; j < kept.size(); ++j) {
      if (kept[j] < 0 || kept[j] >= kv.n_entries || (j > 0 && kept[j] <= kept[j - 1])) {
        throw std::invalid_argument("kv cache: retained entries must be ascending indices of held entries");
      }
    }
  }
  if (kept_per_head.size() == 1) {
    pool_.backend().kv_compact(kv.block_table, kept_per_head[0], pool_.view(), -1);
  } else {
    for (int h = 0; h < n_heads; ++h) pool_.backend().kv_compact(kv.block_table, kept_per_head[size_t(h)], pool_.view(), h);
  }
  const int l = global_layer - layer_begin_;
  const int64_t need = blocks_for(int64_t(n_kept), block_size());
  int64_t freed = 0;
  while (int64_t(kv.block_table.size()) > need) {
    pool_.release(kv.block_table.back());
    kv.block_table.pop_back();
    ++freed;
  }
  account(l, int64_t(n_kept) - kv.n_entries, -freed, 0);
  kv.n_entries = int32_t(n_kept);
}

void KvCache::release(SeqId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  for (int l = 0; l < n_layers(); ++l) {
    LayerKv& kv = it->second[size_t(l)];
    for (int32_t b : kv.block_table) pool_.release(b);
    account(l, -kv.n_entries, -int64_t(kv.block_table.size()), -blocks_for(kv.n_appended, block_size()));
  }
  seqs_.erase(it);
}

}  // namespace strata
