#pragma once
// The KV cache of one rank: for every (sequence, layer) a block table and an entry count, over one BlockPool.
// Layers hold different numbers of entries once a compression policy has run; `n_appended` keeps the count the
// same sequence would hold uncompressed, for the accounting.
//
// In a quantized pool (kv_cache.dtype int8 | int4) a layer's table starts with quantized blocks, each one sealed
// group of 32 entries, and continues with full-precision blocks: new entries are written there, and seal()
// quantizes them once a group is full and the layer's policy no longer needs them unquantized. Entry e is in
// block e / 32 either way, so the model and the attention op address both kinds alike.
#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include "cache/block_pool.h"

namespace strata {

using SeqId = int64_t;

struct LayerKv {
  std::vector<int32_t> block_table;  // blocks in entry order
  int32_t n_quantized_blocks = 0;    // the first ones of block_table: quantized, full groups
  int32_t n_entries = 0;             // entries held (after compression)
  int32_t n_appended = 0;            // entries ever appended (what `full` would hold)
  int32_t n_paired = 0;              // PoD: table positions naming another block's key region, no block of their
                                     // own (kernels/pod_attention.h, pod_paired_id)
};

// What one layer holds over all sequences.
struct LayerUsage {
  int64_t entries = 0;             // tokens held
  int64_t blocks = 0;              // of both kinds
  int64_t quantized_blocks = 0;    // of which quantized
  int64_t bytes = 0;               // the memory the blocks really take: each kind at its own size
  int64_t uncompressed_bytes = 0;  // what the same sequences would take with `full` at full precision
};

class KvCache {
 public:
  // Holds the layers [layer_begin, layer_end) of the model: one pipeline stage's shard.
  KvCache(BlockPool& pool, int layer_begin, int layer_end);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  int layer_begin() const { return layer_begin_; }
  int layer_end() const { return layer_end_; }
  int n_layers() const { return layer_end_ - layer_begin_; }
  const BlockPool& pool() const { return pool_; }
  KvPoolView pool_view() const { return pool_.view(); }
  int block_size() const { return pool_.layout().block_size; }

  // Queries.
  bool contains(SeqId seq) const { return seqs_.count(seq) != 0; }
  // New blocks that appending n_new entries to every layer of seq would take (seq may be unknown: new).
  int64_t blocks_to_append(SeqId seq, int n_new) const;
  bool can_append(SeqId seq, int n_new) const { return blocks_to_append(seq, n_new) <= pool_.n_free(); }
  // Full-precision blocks (slots) that releasing seq gives back: its full-precision blocks and the slabs that
  // hold only its quantized blocks.
  int64_t blocks_held(SeqId seq) const;
  const LayerKv& layer(SeqId seq, int global_layer) const;
  LayerUsage layer_usage(int global_layer) const;
  // The same for one sequence's layer (strata eval records it when a job ends).
  LayerUsage sequence_usage(SeqId seq, int global_layer) const;

  // Actions.
  // Reserves n_new entries at the end of every layer of seq (creating seq if new). Check can_append first.
  void append(SeqId seq, int n_new);
  // Keeps only the entries `kept` (ascending indices into the layer's current entries) of one layer: moves them
  // to the front and returns the blocks no longer needed to the pool at once.
  void retain(SeqId seq, int global_layer, std::span<const int32_t> kept);
  // The same with one list per KV head (all of one length: a layer has one length in all its heads), or a single
  // list for every head.
  void retain(SeqId seq, int global_layer, std::span<const std::vector<int32_t>> kept_per_head);
  // Quantizes the full groups of the layer's full-precision entries (nothing in a full-precision pool) and
  // returns how many were sealed. When the pool has no room for a quantized block, the rest waits for a later
  // call.
  int seal(SeqId seq, int global_layer);
  // PoD storage (docs/compression.md): the layer no longer needs the keys of entries [entry_begin, entry_end).
  // Consecutive pairs of its full-precision blocks wholly inside the range, counted from the first block boundary
  // at or after entry_begin, share one block (values of the second in the key region of the first) and the second
  // returns to the pool. Returns the blocks freed. A layer with paired blocks cannot be compacted (retain).
  int pair_key_free_blocks(SeqId seq, int global_layer, int entry_begin, int entry_end);
  void release(SeqId seq);

 private:
  LayerKv& layer_mut(SeqId seq, int global_layer);
  struct LayerCounts {
    int64_t entries = 0;
    int64_t full_blocks = 0;
    int64_t quantized_blocks = 0;
    int64_t uncompressed_blocks = 0;  // blocks the sequences would hold with `full`
  };
  void account(int local_layer, const LayerCounts& delta);

  BlockPool& pool_;
  int layer_begin_;
  int layer_end_;
  std::map<SeqId, std::vector<LayerKv>> seqs_;
  std::vector<LayerCounts> counts_;  // per local layer
};

}  // namespace strata
