#pragma once
// The KV cache of one rank: for every (sequence, layer) a block table and an entry count, over one BlockPool.
// Layers hold different numbers of entries once a compression policy has run; `n_appended` keeps the count the
// same sequence would hold uncompressed, for the accounting.
//
// In a quantized pool (kv_cache.dtype int8 | int4 | int2) a layer's table starts with quantized blocks, each one sealed
// group of 32 entries, and continues with full-precision blocks: new entries are written there, and seal()
// quantizes them once a group is full and the layer's policy no longer needs them unquantized. Entry e is in
// block e / 32 either way, so the model and the attention op address both kinds alike.
//
// A layer whose policy replaced its entries by codebook references (SpindleKV; docs/compression.md) starts with
// coded blocks, each one full group of block_size coded entries (kernels/kv_block_layout.h), and keeps its
// codebook vectors in pages: full-precision slots outside the block table. Its last, partial group stays in a
// full-precision block that holds the entries' reconstructions, while their codes go to an open coded block that
// replaces it once the group is full. Entry e is again in block e / block_size.
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "cache/block_pool.h"
#include "cache/layer_codebook.h"

namespace strata {

using SeqId = int64_t;

struct LayerKv {
  std::vector<int32_t> block_table;  // blocks in entry order
  int32_t n_quantized_blocks = 0;    // the first ones of block_table: quantized, full groups
  int32_t n_coded_blocks = 0;        // or coded, full groups (a layer has one kind or neither)
  std::optional<LayerCodebook> codebook;  // once the layer's entries were replaced
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
  int64_t coded_blocks = 0;        // of which coded (including open ones)
  int64_t codebook_pages = 0;      // slots holding codebook vectors (counted in bytes, not in blocks)
  int64_t codebook_vectors = 0;    // codebook entries, every head, keys and values
  int64_t shared_key_entries = 0;  // PoD: entries whose keys the layer no longer holds (its leader's are shared)
  int64_t bytes = 0;               // the pool memory the blocks take: packed ones at their share of a slot
  // Of bytes, the blocks and codebook pages that hold entries at the pool's own precision (f32 on the CPU, bf16 on
  // CUDA): what would halve where the entries are half as wide, while quantized and coded blocks keep their size.
  int64_t full_precision_bytes = 0;
  int64_t uncompressed_bytes = 0;  // what the same sequences would take with `full` at full precision
  // Prefix caching: the layer's blocks in the cache, used by sequences or not. A block a sequence shares counts in
  // that sequence's blocks and bytes above too (each sequence as if it held it alone).
  int64_t cached_blocks = 0;
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
  // The most pool bytes seq held over all its layers so far, taken after every append and start (a compression
  // runs after its step's append, so the moment before it is counted): what its peak cost the pool.
  // With the bytes at that moment that were full precision (LayerUsage::full_precision_bytes): a quantized pool's
  // unsealed entries, a chunk's worth while a prompt is prefilled in chunks.
  struct HeldBytes {
    int64_t bytes = 0;
    int64_t full_precision_bytes = 0;
  };
  HeldBytes peak(SeqId seq) const;

  // Actions.
  // Reserves n_new entries at the end of every layer of seq (creating seq if new). Check can_append first.
  void append(SeqId seq, int n_new);
  // Takes back the last n entries appended to one layer, which must be full precision (chunked prefill's scoring
  // rows, LayerState::scoring_rows): the blocks past the rest return to the pool, and n_appended no longer counts
  // them (they were never the sequence's).
  void drop_appended(SeqId seq, int global_layer, int n);
  // Keeps only the entries `kept` (ascending indices into the layer's current entries) of one layer: moves them
  // to the front and returns the blocks no longer needed to the pool at once.
  void retain(SeqId seq, int global_layer, std::span<const int32_t> kept);
  // The same with one list per KV head (all of one length: a layer has one length in all its heads), or a single
  // list for every head.
  void retain(SeqId seq, int global_layer, std::span<const std::vector<int32_t>> kept_per_head);
  // D2O: merges evicted entries into kept ones, one KvMerges per KV head of the layer (Backend::kv_merge, on
  // full-precision blocks), before the compaction that drops them (retain).
  void merge(SeqId seq, int global_layer, std::span<const KvMerges> per_head);
  // Quantizes the full groups of the layer's full-precision entries (nothing in a full-precision pool) and
  // returns how many were sealed. When the pool has no room for a quantized block, the rest waits for a later
  // call.
  int seal(SeqId seq, int global_layer);
  // SpindleKV (docs/compression.md): replaces every entry of a full-precision layer by references into codebooks
  // built greedily per KV head (Backend::kv_codebook_build), keys before RoPE. positions: the original position
  // of each entry (one list for all KV heads, or one per head). Returns false, leaving the layer as it was, when
  // the pool has no room for the codebooks; throws for a quantized pool or one without its key RoPE table.
  bool replace_with_codebook(SeqId seq, int global_layer, std::span<const std::vector<int32_t>> positions,
                             float key_threshold, float value_threshold);
  // Codes the entries appended to a codebook layer since (a decode step's): each
  // joins the closest codebook entry above the threshold or becomes a new entry (spec 4, decode-time update).
  // last_position: the position of the layer's last entry (entries after replacement are consecutive positions).
  // A new key or value that misses every codebook entry while the pool has no slot for a new codebook page joins
  // its nearest entry; a group whose coded block finds no room stays uncoded, and so do the entries after it.
  void code_appended(SeqId seq, int global_layer, int last_position);
  // The key RoPE table coded keys need (BlockPool::set_key_rope).
  void set_key_rope(const RopeParams& rope, int n_positions) { pool_.set_key_rope(rope, n_positions); }
  // PoD storage (docs/compression.md): the layer no longer needs the keys of entries [entry_begin, entry_end).
  // Consecutive pairs of its full-precision blocks wholly inside the range, counted from the first block boundary
  // at or after entry_begin, share one block (values of the second in the key region of the first) and the second
  // returns to the pool. Returns the blocks freed. A layer with paired blocks cannot be compacted (retain).
  int pair_key_free_blocks(SeqId seq, int global_layer, int entry_begin, int entry_end);
  void release(SeqId seq);

  // Prefix caching (leader/prefix_index.h names the blocks by hash). A published block of a sequence (block
  // `index` of every layer: entries [index * block_size, (index + 1) * block_size)) stays in the cache under its
  // hash after the sequence is gone, until evicted; a new sequence may start from cached blocks. Every holder
  // reads them; an operation that would write into a block that has other holders copies it first, so a policy
  // that evicts, merges, pairs or codes entries changes only its own sequence's copy.
  // Whether every layer's block `index` of seq still holds its original entries at full precision (nothing
  // compacted, merged, paired, coded or sealed there).
  bool can_publish(SeqId seq, int index) const;
  void publish(SeqId seq, int index, uint64_t hash);
  // A compressed prefix (a query-agnostic policy's entries right after a chunked compression point;
  // leader/prefix_cache.h): block `index` of every layer of seq, whose layers all hold the same number of entries
  // in whole blocks (full-precision ones, or a quantized pool's sealed groups), stays cached under `hash`. Throws
  // std::logic_error when they do not.
  void publish_compressed(SeqId seq, int index, uint64_t hash);
  bool is_cached(uint64_t hash) const { return prefix_blocks_.count(hash) != 0; }
  int64_t n_cached_blocks() const { return int64_t(prefix_blocks_.size()); }  // per layer
  // A new sequence whose layers start with the cached blocks `hashes` (a chain, in order); with `copy`, with copies
  // of them that are its own (one new block per cached block and layer: check the pool first). `position`: the
  // prompt tokens they stand for, when they are a compressed prefix (fewer entries than tokens); 0: their own.
  // Sealed groups among them stay shared as they are: such a sequence never rewrites them (own_blocks throws).
  void start_from_prefix(SeqId seq, std::span<const uint64_t> hashes, bool copy = false, int position = 0);
  // The cache lets go of these blocks; each returns to the pool once no sequence holds it.
  void evict(std::span<const uint64_t> hashes);
  // strata eval's shared prefill (eval/shared_prefill.h): a new sequence whose layers start with copies of the
  // first n_entries entries of `source`, which must still hold them as written (one new block per block copied and
  // layer: check the pool first).
  void fork(SeqId source, SeqId seq, int n_entries);

 private:
  LayerKv& layer_mut(SeqId seq, int global_layer);
  struct LayerCounts {
    int64_t entries = 0;
    int64_t full_blocks = 0;
    int64_t quantized_blocks = 0;
    int64_t uncompressed_blocks = 0;  // blocks the sequences would hold with `full`
    int64_t coded_blocks = 0;
    int64_t codebook_pages = 0;
    int64_t codebook_vectors = 0;
    int64_t shared_key_entries = 0;
  };
  // The next vector id of a layer's codebook pages, allocating a page when the last one is full; -1 when the pool
  // has no slot for it.
  int32_t next_codebook_vector(LayerCodebook& codebook, int local_layer);
  void release_codebook(LayerKv& kv, int local_layer);
  // A full group's coded block replaces its full-precision block, which goes back to the pool.
  void swap_in_coded_block(LayerKv& kv, int local_layer, size_t group, int32_t coded_block);
  // PoD: a pair of key-free blocks holds the values of 2 * block_size entries whose keys are gone.
  int64_t shared_key_entries(const LayerKv& kv) const { return 2LL * kv.n_paired * block_size(); }
  void account(int local_layer, const LayerCounts& delta);
  void note_peak(SeqId seq);
  // Copy-on-write: the first n_blocks of the layer's table become blocks of its own (full-precision copies of
  // those that had other holders).
  void own_blocks(LayerKv& kv, size_t n_blocks);
  // Block `index` of every layer of seq stays cached under `hash` (publish, publish_compressed).
  void keep_cached(SeqId seq, int index, uint64_t hash);

  BlockPool& pool_;
  int layer_begin_;
  int layer_end_;
  std::map<SeqId, std::vector<LayerKv>> seqs_;
  std::vector<LayerCounts> counts_;  // per local layer
  std::map<SeqId, HeldBytes> peaks_;
  std::unordered_map<uint64_t, std::vector<int32_t>> prefix_blocks_;  // hash -> the block of each local layer
};

}  // namespace strata
