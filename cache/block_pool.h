#pragma once
// One rank's pool of fixed-size KV blocks, carved out at start-up from a memory budget. A block holds block_size
// entries of ONE layer (all of the rank's KV heads), so a block freed by one layer serves any layer or sequence.
//
// The pool is an array of slots, each the size of one full-precision block. In a quantized pool
// (layout.quant int8 | int4 | int2, kernels/kv_block_layout.h) a slot either holds a full-precision block (the staging
// blocks that new entries are written to) or serves as a slab of quantized_per_slot() quantized blocks (sealed
// groups). One budget therefore serves both formats, and memory moves between them as groups are sealed: a long
// prompt may fill the pool at full precision and shrink once it is quantized. Quantized blocks are taken from
// the fullest slab that has room, so that slabs empty out and return to the pool as slots.
//
// An f32 pool packs coded blocks (SpindleKV's codebook references, kernels/kv_block_layout.h) into slabs the same
// way, and keeps its codebook vectors in full-precision slots.
//
// Counts for admission (n_total, n_free, can_allocate) are slots for full-precision blocks. A quantized pool keeps
// one free slot in reserve that only quantized blocks may take: sealing a group then always finds room, and
// gives the slot of the full-precision block it quantized back right after.
#include <algorithm>
#include <cstdint>
#include <set>
#include <vector>

#include "kernels/backend.h"
#include "kernels/kv_block_layout.h"

namespace strata {

class BlockPool {
 public:
  BlockPool(Backend& backend, KvBlockLayout layout, int64_t n_slots);
  ~BlockPool();
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  // Slots (full-precision blocks) that fit in memory_bytes.
  static int64_t blocks_for_memory(const KvBlockLayout& layout, int64_t memory_bytes);

  // Full-precision blocks: what appends need.
  int64_t n_total() const { return n_slots_ - reserve_; }
  int64_t n_free() const { return std::max<int64_t>(0, int64_t(free_.size()) - reserve_); }
  bool can_allocate(int64_t n) const { return n <= n_free(); }
  // Throws std::runtime_error when the pool is empty (callers check can_allocate first). use_reserve: a
  // quantized pool's reserve may be taken too (KvCache::retain, which gives more back than it takes).
  int32_t allocate(bool use_reserve = false);

  // Quantized blocks (a quantized pool only).
  bool quantized() const { return layout_.quant != KvQuant::none; }
  bool can_allocate_quantized() const;
  int32_t allocate_quantized();  // may take the reserve; throws std::runtime_error when there is no room
  bool is_quantized(int32_t block) const { return view().is_quantized(block); }
  // The slot a block lives in, and how many quantized blocks its slab holds (0 for a full-precision block).
  int32_t slot_of(int32_t block) const;
  int slab_used(int32_t slot) const { return slab_used_[size_t(slot)]; }

  // Coded blocks (an f32 pool only). Packed like quantized blocks; allocate_coded throws when there is no room.
  bool can_allocate_coded() const;
  int32_t allocate_coded();
  // The table coded keys are rotated with on read (KvKeyRope): the model's RoPE over n_positions positions.
  // Set once, before the first coded block is written.
  void set_key_rope(const RopeParams& rope, int n_positions);
  bool has_key_rope() const { return key_rope_.n_positions > 0; }

  // Any kind. A block may be in several block tables at once (the prefix cache shares a prompt's blocks):
  // share() adds a holder, release() removes one, and the block returns to the pool with its last holder.
  void share(int32_t block);
  int holders(int32_t block) const { return holders_.at(size_t(block)); }
  void release(int32_t block);

  const KvBlockLayout& layout() const { return layout_; }
  KvPoolView view() const { return KvPoolView{storage_.data, layout_, int32_t(n_slots_), key_rope_}; }
  Backend& backend() const { return backend_; }

 private:
  void set_slab_free_count(int32_t slot, int before, int after);
  int32_t allocate_packed();
  bool can_allocate_packed() const;

  Backend& backend_;
  KvBlockLayout layout_;
  int64_t n_slots_;
  int64_t reserve_;  // 1 in a quantized pool
  int per_slot_;     // quantized (or coded) blocks per slab
  Tensor storage_;
  std::vector<int32_t> free_;      // free slots, a stack: the most recently freed is reused first (warm in cache)
  std::vector<bool> is_free_;      // catches a block released twice, which would later be handed out twice
  std::vector<uint16_t> holders_;  // per block id, both kinds: 0 while free
  std::vector<uint8_t> slab_used_;  // per slot: quantized blocks in use (0 for free and full-precision slots)
  std::vector<uint32_t> slab_bits_;  // per slot: which of them
  std::vector<std::set<int32_t>> slabs_by_free_;  // [n] = slabs with n free quantized blocks, 1 <= n < per_slot
  Tensor key_rope_table_;
  KvKeyRope key_rope_;
};

}  // namespace strata
