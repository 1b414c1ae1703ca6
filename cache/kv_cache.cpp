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
  for (const auto& [hash, blocks] : prefix_blocks_) {
    for (int32_t b : blocks) pool_.release(b);
  }
}

static int64_t blocks_for(int64_t entries, int block_size) { return (entries + block_size - 1) / block_size; }

// Entries and blocks after a layer's quantized (or coded) ones.
static int64_t full_entries(const LayerKv& kv, int block_size) {
  return kv.n_entries - int64_t(kv.n_quantized_blocks + kv.n_coded_blocks) * block_size;
}
static int64_t full_blocks(const LayerKv& kv) {
  return int64_t(kv.block_table.size()) - kv.n_quantized_blocks - kv.n_coded_blocks;
}

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
  std::unordered_map<int32_t, int> per_slab;  // quantized blocks that seq alone holds, in each slab
  for (const LayerKv& l : it->second) {
    for (size_t i = size_t(l.n_quantized_blocks + l.n_coded_blocks); i < l.block_table.size(); ++i) {
      const int32_t b = l.block_table[i];
      total += !pod_is_paired(b) && pool_.holders(b) == 1 ? 1 : 0;  // a shared block stays for its other holders
    }
    for (int i = 0; i < l.n_quantized_blocks + l.n_coded_blocks; ++i) {
      const int32_t b = l.block_table[size_t(i)];
      if (pool_.holders(b) == 1) ++per_slab[pool_.slot_of(b)];  // a shared one keeps its slab in use
    }
    if (l.codebook) {
      total += int64_t(l.codebook->pages.size());
      if (l.codebook->open_block >= 0) ++per_slab[pool_.slot_of(l.codebook->open_block)];
    }
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
  u.blocks += c.coded_blocks;
  u.coded_blocks = c.coded_blocks;
  u.codebook_pages = c.codebook_pages;
  u.codebook_vectors = c.codebook_vectors;
  u.shared_key_entries = c.shared_key_entries;
  const KvBlockLayout& L = pool_.layout();
  u.full_precision_bytes = (c.full_blocks + c.codebook_pages) * L.block_bytes();
  u.bytes = u.full_precision_bytes + L.packed_pool_bytes(c.quantized_blocks + c.coded_blocks);
  u.uncompressed_bytes = c.uncompressed_blocks * pool_.layout().block_bytes();
  u.cached_blocks = n_cached_blocks();
  return u;
}

LayerUsage KvCache::sequence_usage(SeqId seq, int global_layer) const {
  const LayerKv& kv = layer(seq, global_layer);
  LayerUsage u;
  u.entries = kv.n_entries;
  u.blocks = int64_t(kv.block_table.size()) - kv.n_paired;
  u.quantized_blocks = kv.n_quantized_blocks;
  const KvBlockLayout& L = pool_.layout();
  u.full_precision_bytes = (u.blocks - u.quantized_blocks - kv.n_coded_blocks) * L.block_bytes();
  u.bytes = u.full_precision_bytes + L.packed_pool_bytes(u.quantized_blocks);
  if (kv.codebook) {
    u.coded_blocks = kv.n_coded_blocks + (kv.codebook->open_block >= 0 ? 1 : 0);
    u.blocks += u.coded_blocks - kv.n_coded_blocks;
    u.codebook_pages = int64_t(kv.codebook->pages.size());
    u.codebook_vectors = kv.codebook->size();
    u.bytes += L.packed_pool_bytes(u.coded_blocks) + u.codebook_pages * L.block_bytes();
    u.full_precision_bytes += u.codebook_pages * L.block_bytes();
  }
  u.shared_key_entries = shared_key_entries(kv);
  u.uncompressed_bytes = blocks_for(kv.n_appended, block_size()) * pool_.layout().block_bytes();
  return u;
}

KvCache::HeldBytes KvCache::peak(SeqId seq) const {
  auto it = peaks_.find(seq);
  return it == peaks_.end() ? HeldBytes{} : it->second;
}

void KvCache::note_peak(SeqId seq) {
  HeldBytes now;
  for (int l = layer_begin_; l < layer_end_; ++l) {
    const LayerUsage u = sequence_usage(seq, l);
    now.bytes += u.bytes;
    now.full_precision_bytes += u.full_precision_bytes;
  }
  HeldBytes& peak = peaks_[seq];
  if (now.bytes > peak.bytes) peak = now;
}

void KvCache::account(int l, const LayerCounts& d) {
  LayerCounts& c = counts_[size_t(l)];
  c.entries += d.entries;
  c.full_blocks += d.full_blocks;
  c.quantized_blocks += d.quantized_blocks;
  c.uncompressed_blocks += d.uncompressed_blocks;
  c.coded_blocks += d.coded_blocks;
  c.codebook_pages += d.codebook_pages;
  c.codebook_vectors += d.codebook_vectors;
  c.shared_key_entries += d.shared_key_entries;
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
  note_peak(seq);
}

void KvCache::drop_appended(SeqId seq, int global_layer, int n) {
  LayerKv& kv = layer_mut(seq, global_layer);
  if (n < 0 || n > full_entries(kv, block_size()) || n > kv.n_appended) {
    throw std::logic_error("kv cache: dropping " + std::to_string(n) + " entries of " +
                           std::to_string(full_entries(kv, block_size())) + " full-precision ones");
  }
  const int64_t uncompressed_dropped =
      blocks_for(kv.n_appended, block_size()) - blocks_for(kv.n_appended - n, block_size());
  kv.n_entries -= n;
  kv.n_appended -= n;
  int64_t freed = 0;
  while (full_blocks(kv) > blocks_for(full_entries(kv, block_size()), block_size())) {
    pool_.release(kv.block_table.back());
    kv.block_table.pop_back();
    ++freed;
  }
  account(global_layer - layer_begin_, {-n, -freed, 0, -uncompressed_dropped});
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
  if (kv.codebook) throw std::logic_error("kv cache: a layer replaced by codebooks cannot be compacted");
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
  own_blocks(kv, size_t(kept_quantized + full_need));  // the blocks the compaction writes
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

void KvCache::merge(SeqId seq, int global_layer, std::span<const KvMerges> per_head) {
  if (int(per_head.size()) != pool_.layout().n_kv_heads) {
    throw std::logic_error("kv cache: merges for " + std::to_string(per_head.size()) + " KV heads, the layer has " +
                           std::to_string(pool_.layout().n_kv_heads));
  }
  LayerKv& kv = layer_mut(seq, global_layer);
  own_blocks(kv, kv.block_table.size());
  for (size_t h = 0; h < per_head.size(); ++h) pool_.backend().kv_merge(kv.block_table, per_head[h], pool_view(), int(h));
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
  own_blocks(kv, kv.block_table.size());
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
  const int64_t shared_before = shared_key_entries(kv);
  kv.n_paired += int32_t(first.size());
  account(global_layer - layer_begin_, {0, -int64_t(first.size()), 0, 0, 0, 0, 0, shared_key_entries(kv) - shared_before});
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
                -blocks_for(kv.n_appended, block_size()), -int64_t(kv.n_coded_blocks), 0, 0, -shared_key_entries(kv)});
    if (kv.codebook) release_codebook(kv, l);
  }
  seqs_.erase(it);
  peaks_.erase(seq);
}

// ---------------------------------------------------------------------------------------------------------------
// Prefix caching

bool KvCache::can_publish(SeqId seq, int index) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end() || index < 0) return false;
  for (const LayerKv& kv : it->second) {
    const bool original = kv.n_entries == kv.n_appended && kv.n_coded_blocks == 0 && !kv.codebook && kv.n_paired == 0;
    if (!original || index < kv.n_quantized_blocks || int64_t(index + 1) * block_size() > kv.n_entries) return false;
  }
  return true;
}

void KvCache::publish(SeqId seq, int index, uint64_t hash) {
  if (!can_publish(seq, index)) {
    throw std::logic_error("kv cache: block " + std::to_string(index) + " of sequence " + std::to_string(seq) +
                           " no longer holds its prompt's entries as they were written");
  }
  keep_cached(seq, index, hash);
}

void KvCache::keep_cached(SeqId seq, int index, uint64_t hash) {
  if (is_cached(hash)) throw std::logic_error("kv cache: a prefix block published twice");
  std::vector<int32_t> blocks;
  for (const LayerKv& kv : seqs_.at(seq)) {
    const int32_t b = kv.block_table[size_t(index)];
    pool_.share(b);
    blocks.push_back(b);
  }
  prefix_blocks_.emplace(hash, std::move(blocks));
}

void KvCache::publish_compressed(SeqId seq, int index, uint64_t hash) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) throw std::logic_error("kv cache: publishing a compressed block of an unknown sequence");
  const int32_t n_entries = it->second.front().n_entries;
  for (const LayerKv& kv : it->second) {
    const bool plain = kv.n_coded_blocks == 0 && !kv.codebook && kv.n_paired == 0;
    if (!plain || kv.n_entries != n_entries || n_entries % block_size() != 0 || index < 0 ||
        int64_t(index + 1) * block_size() > n_entries) {
      throw std::logic_error("kv cache: block " + std::to_string(index) + " of sequence " + std::to_string(seq) +
                             " is not a whole block of a compressed prefix");
    }
  }
  keep_cached(seq, index, hash);
}

void KvCache::start_from_prefix(SeqId seq, std::span<const uint64_t> hashes, bool copy, int position) {
  if (contains(seq)) throw std::logic_error("kv cache: sequence " + std::to_string(seq) + " already holds entries");
  std::vector<LayerKv> layers(static_cast<size_t>(n_layers()));
  for (uint64_t hash : hashes) {
    auto it = prefix_blocks_.find(hash);
    if (it == prefix_blocks_.end()) throw std::logic_error("kv cache: a prefix block that is not cached");
    for (size_t l = 0; l < layers.size(); ++l) layers[l].block_table.push_back(it->second[l]);
  }
  const int32_t n_entries = int32_t(hashes.size()) * block_size();
  const int32_t n_appended = position > 0 ? position : n_entries;
  for (size_t l = 0; l < layers.size(); ++l) {
    LayerKv& kv = layers[l];
    // A compressed prefix of a quantized pool: its sealed groups first, as in the layer it was published from.
    const auto first_full = std::find_if(kv.block_table.begin(), kv.block_table.end(),
                                         [&](int32_t b) { return !pool_.is_quantized(b); });
    if (std::any_of(first_full, kv.block_table.end(), [&](int32_t b) { return pool_.is_quantized(b); })) {
      throw std::logic_error("kv cache: a cached prefix with a sealed group after a full-precision block");
    }
    kv.n_quantized_blocks = int32_t(first_full - kv.block_table.begin());
    for (int32_t b : kv.block_table) pool_.share(b);
    if (copy) own_blocks(kv, kv.block_table.size());
    kv.n_entries = n_entries;
    kv.n_appended = n_appended;
    account(int(l), {n_entries, full_blocks(kv), kv.n_quantized_blocks, blocks_for(n_appended, block_size())});
  }
  seqs_.emplace(seq, std::move(layers));
  note_peak(seq);
}

void KvCache::evict(std::span<const uint64_t> hashes) {
  for (uint64_t hash : hashes) {
    auto it = prefix_blocks_.find(hash);
    if (it == prefix_blocks_.end()) throw std::logic_error("kv cache: evicting a prefix block that is not cached");
    for (int32_t b : it->second) pool_.release(b);
    prefix_blocks_.erase(it);
  }
}

void KvCache::fork(SeqId source, SeqId seq, int n_entries) {
  if (contains(seq)) throw std::logic_error("kv cache: sequence " + std::to_string(seq) + " already holds entries");
  auto it = seqs_.find(source);
  const bool as_written = it != seqs_.end() && n_entries > 0 &&
                          std::all_of(it->second.begin(), it->second.end(), [&](const LayerKv& kv) {
                            return kv.n_entries == kv.n_appended && kv.n_entries >= n_entries &&
                                   kv.n_quantized_blocks == 0 && kv.n_coded_blocks == 0 && !kv.codebook &&
                                   kv.n_paired == 0;
                          });
  if (!as_written) {
    throw std::logic_error("kv cache: sequence " + std::to_string(source) + " does not hold " +
                           std::to_string(n_entries) + " entries as written");
  }
  const int64_t n_blocks = blocks_for(n_entries, block_size());
  std::vector<LayerKv> layers(static_cast<size_t>(n_layers()));
  for (size_t l = 0; l < layers.size(); ++l) {
    LayerKv& kv = layers[l];
    const std::vector<int32_t>& from = it->second[l].block_table;
    kv.block_table.assign(from.begin(), from.begin() + n_blocks);
    for (int32_t b : kv.block_table) pool_.share(b);
    own_blocks(kv, kv.block_table.size());
    kv.n_entries = kv.n_appended = n_entries;
    account(int(l), {n_entries, n_blocks, 0, n_blocks});
  }
  seqs_.emplace(seq, std::move(layers));
  note_peak(seq);
}

// A block is copied by a compaction over the table {copy, original} that moves every entry of the second block
// to the first. Shared blocks are full precision (published as written), so the copy is exact, or the sealed
// groups of a compressed prefix, which no sequence that starts from it rewrites (its tail holds no compression
// point, and query-agnostic policies do not compress while decoding).
void KvCache::own_blocks(LayerKv& kv, size_t n_blocks) {
  std::vector<int32_t> entries(static_cast<size_t>(block_size()));
  for (size_t i = 0; i < entries.size(); ++i) entries[i] = int32_t(entries.size() + i);
  for (size_t i = 0; i < std::min(n_blocks, kv.block_table.size()); ++i) {
    const int32_t b = kv.block_table[i];
    if (pod_is_paired(b) || pool_.holders(b) <= 1) continue;
    if (pool_.is_quantized(b)) throw std::logic_error("kv cache: a shared sealed group would be rewritten");
    const int32_t copy = pool_.allocate();
    const int32_t pair[2] = {copy, b};
    pool_.backend().kv_compact(pair, entries, pool_.view(), -1);
    pool_.release(b);
    kv.block_table[i] = copy;
  }
}

}  // namespace strata

// SpindleKV storage (docs/compression.md "SpindleKV"); the codebooks' planning and encoding: cache/layer_codebook.h.
namespace strata {

int32_t KvCache::next_codebook_vector(LayerCodebook& cb, int l) {
  const int64_t per_page = pool_.layout().vectors_per_slot();
  if (cb.n_vectors == int64_t(cb.pages.size()) * per_page) {
    if (!pool_.can_allocate(1)) return -1;
    cb.pages.push_back(pool_.allocate());
    account(l, {0, 0, 0, 0, 0, 1, 0});
  }
  const int32_t id = int32_t(cb.pages[size_t(cb.n_vectors / per_page)] * per_page + cb.n_vectors % per_page);
  ++cb.n_vectors;
  account(l, {0, 0, 0, 0, 0, 0, 1});
  return id;
}

void KvCache::release_codebook(LayerKv& kv, int l) {
  LayerCodebook& cb = *kv.codebook;
  for (int32_t page : cb.pages) pool_.release(page);
  if (cb.open_block >= 0) pool_.release(cb.open_block);
  account(l, {0, 0, 0, 0, -int64_t(cb.open_block >= 0 ? 1 : 0), -int64_t(cb.pages.size()), -int64_t(cb.n_vectors)});
  kv.codebook.reset();
}

void KvCache::swap_in_coded_block(LayerKv& kv, int l, size_t group, int32_t coded_block) {
  pool_.release(kv.block_table[group]);
  kv.block_table[group] = coded_block;
  ++kv.n_coded_blocks;
  account(l, {0, -1, 0, 0});
}

bool KvCache::replace_with_codebook(SeqId seq, int global_layer, std::span<const std::vector<int32_t>> positions,
                                    float key_threshold, float value_threshold) {
  if (pool_.quantized()) {
    throw std::invalid_argument("kv cache: codebook replacement (spindlekv) needs kv_cache.dtype f32");
  }
  if (!pool_.has_key_rope()) throw std::logic_error("kv cache: codebook replacement before the key RoPE table is set");
  LayerKv& kv = layer_mut(seq, global_layer);
  if (kv.codebook || kv.n_quantized_blocks > 0 || kv.n_paired > 0) {
    throw std::logic_error("kv cache: codebook replacement of a layer that is not all full precision");
  }
  const int n_heads = pool_.layout().n_kv_heads, n = kv.n_entries, bs = block_size();
  check_codebook_positions(positions, n_heads, n);
  if (n == 0) return false;
  Backend& backend = pool_.backend();
  const KvPoolView view = pool_.view();
  const std::vector<HeadCodebookPlan> plans =
      plan_codebooks(backend, view, kv.block_table, positions, n, key_threshold, value_threshold);
  // Room for the pages and the coded blocks (fresh slabs at worst) before the groups' blocks are given back.
  const int64_t per_page = pool_.layout().vectors_per_slot();
  const int64_t n_groups = (n + bs - 1) / bs;
  const int per_slab = pool_.layout().coded_per_slot();
  if (per_slab < 1) throw std::invalid_argument("kv cache: KV blocks too small to hold coded blocks");
  if (!pool_.can_allocate((codebook_vectors(plans) + per_page - 1) / per_page + (n_groups + per_slab - 1) / per_slab)) {
    return false;
  }

  const int l = global_layer - layer_begin_;
  LayerCodebook cb;
  cb.key_threshold = key_threshold;
  cb.value_threshold = value_threshold;
  cb.keys.resize(size_t(n_heads));
  cb.values.resize(size_t(n_heads));
  std::vector<int32_t> coded(static_cast<size_t>(n_groups));
  for (int32_t& b : coded) b = pool_.allocate_coded();
  account(l, {0, 0, 0, 0, n_groups, 0, 0});
  const int full_groups = n / bs;
  for (int h = 0; h < n_heads; ++h) {
    KvCodebookEncoding e = head_encoding(plans[size_t(h)], h, head_positions(positions, h), cb,
                                         [&] { return next_codebook_vector(cb, l); });
    e.coded_blocks = coded;
    e.write_back_from = full_groups * bs;
    backend.kv_codebook_encode(kv.block_table, e, view);
  }
  // Full groups now live in their coded blocks; the partial one keeps its block (holding reconstructions).
  for (int g = 0; g < full_groups; ++g) swap_in_coded_block(kv, l, size_t(g), coded[size_t(g)]);
  cb.open_block = full_groups < n_groups ? coded[size_t(full_groups)] : -1;
  cb.n_coded = n;
  kv.codebook = std::move(cb);
  return true;
}

void KvCache::code_appended(SeqId seq, int global_layer, int last_position) {
  LayerKv& kv = layer_mut(seq, global_layer);
  if (!kv.codebook) return;
  LayerCodebook& cb = *kv.codebook;
  const int l = global_layer - layer_begin_, bs = block_size(), n_heads = pool_.layout().n_kv_heads;
  Backend& backend = pool_.backend();
  while (cb.n_coded < kv.n_entries) {
    const int entry = cb.n_coded;
    const int32_t position = last_position - (kv.n_entries - 1 - entry);
    if (cb.open_block < 0) {
      if (entry % bs != 0 || !pool_.can_allocate_coded()) return;  // stays uncoded (see the header)
      cb.open_block = pool_.allocate_coded();
      account(l, {0, 0, 0, 0, 1, 0, 0});
    }
    const KvPoolView view = pool_.view();
    for (int h = 0; h < n_heads; ++h) {
      KvCodebookEncoding e;
      e.head = h;
      e.entry_begin = entry;
      e.positions = {position};
      e.coded_blocks = {cb.open_block};
      e.write_back_from = entry;
      for (KvPart part : {KvPart::key, KvPart::value}) {
        std::vector<int32_t>& codebook = part == KvPart::key ? cb.keys[size_t(h)] : cb.values[size_t(h)];
        const float threshold = part == KvPart::key ? cb.key_threshold : cb.value_threshold;
        float similarity = 0.0f;
        int32_t index = -1;
        backend.kv_codebook_match(kv.block_table, h, part, std::span<const int32_t>(&entry, 1), e.positions, codebook,
                                  view, std::span<float>(&similarity, 1), std::span<int32_t>(&index, 1));
        int32_t vector = index >= 0 && similarity > threshold ? codebook[size_t(index)] : -1;
        if (vector < 0) {
          vector = next_codebook_vector(cb, l);
          if (vector >= 0) {
            codebook.push_back(vector);
            (part == KvPart::key ? e.new_k_entries : e.new_v_entries).push_back(entry);
            (part == KvPart::key ? e.new_k_vectors : e.new_v_vectors).push_back(vector);
          } else {
            vector = codebook[size_t(index)];  // no room for a new entry: the nearest one
          }
        }
        (part == KvPart::key ? e.k_vectors : e.v_vectors).push_back(vector);
      }
      backend.kv_codebook_encode(kv.block_table, e, view);
    }
    ++cb.n_coded;
    if (cb.n_coded % bs == 0) {  // the group is full
      swap_in_coded_block(kv, l, size_t(cb.n_coded / bs - 1), cb.open_block);
      cb.open_block = -1;
    }
  }
}

}  // namespace strata
