#include "cache/block_pool.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/kv_codebook.h"

namespace strata {

int64_t BlockPool::blocks_for_memory(const KvBlockLayout& layout, int64_t memory_bytes) {
  return memory_bytes / layout.block_bytes();
}

BlockPool::BlockPool(Backend& backend, KvBlockLayout layout, int64_t n_slots)
    : backend_(backend),
      layout_(layout),
      n_slots_(n_slots),
      reserve_(layout.quant == KvQuant::none ? 0 : 1),
      per_slot_(layout.packed_per_slot()) {
  // Quantized ids run up to n_slots * (1 + per_slot).
  if (n_slots <= reserve_ || n_slots > INT32_MAX / (1 + per_slot_)) {
    throw std::invalid_argument("block pool: " + std::to_string(n_slots) + " blocks is not a usable pool size");
  }
  if (quantized()) {
    if (layout.block_size != kKvQuantGroup || layout.head_dim % kKvQuantGroup != 0) {
      throw std::invalid_argument("block pool: quantized blocks need block_size " + std::to_string(kKvQuantGroup) +
                                  " and a head_dim that is a multiple of it");
    }
    if (per_slot_ < 1) throw std::logic_error("block pool: a quantized block larger than a slot");
  }
  per_slot_ = std::min(per_slot_, 32);  // coded blocks: one bit each in a slab's 32-bit mask
  storage_ = backend_.alloc(n_slots, layout_.elements_per_block(), layout_.dtype);
  free_.reserve(size_t(n_slots));
  for (int64_t b = n_slots - 1; b >= 0; --b) free_.push_back(int32_t(b));
  is_free_.assign(size_t(n_slots), true);
  holders_.assign(size_t(n_slots * (1 + per_slot_)), 0);
  slab_used_.assign(size_t(n_slots), 0);
  slab_bits_.assign(size_t(n_slots), 0);
  slabs_by_free_.resize(size_t(std::max(per_slot_, 1)));
}

BlockPool::~BlockPool() {
  backend_.free(storage_);
  if (key_rope_table_.data) backend_.free(key_rope_table_);
}

void BlockPool::set_key_rope(const RopeParams& rope, int n_positions) {
  if (n_positions <= 0) throw std::invalid_argument("block pool: key RoPE table needs a positive number of positions");
  if (has_key_rope()) return;
  std::vector<float> table(size_t(n_positions) * size_t(layout_.head_dim));
  key_rope_table(layout_.head_dim, rope, n_positions, table.data());
  key_rope_table_ = backend_.alloc(n_positions, layout_.head_dim, DType::f32);
  backend_.copy_from_host(table.data(), key_rope_table_);
  key_rope_ = KvKeyRope{key_rope_table_.f32(), n_positions, rope.style};
}

int32_t BlockPool::allocate(bool use_reserve) {
  if (use_reserve ? free_.empty() : n_free() == 0) throw std::runtime_error("block pool: no free KV block");
  const int32_t b = free_.back();
  free_.pop_back();
  is_free_[size_t(b)] = false;
  holders_[size_t(b)] = 1;
  return b;
}

bool BlockPool::can_allocate_quantized() const { return quantized() && can_allocate_packed(); }
bool BlockPool::can_allocate_coded() const { return !quantized() && per_slot_ > 0 && can_allocate_packed(); }

int32_t BlockPool::allocate_quantized() {
  if (!quantized()) throw std::logic_error("block pool: quantized block from a full-precision pool");
  return allocate_packed();
}

int32_t BlockPool::allocate_coded() {
  if (quantized() || per_slot_ < 1) throw std::logic_error("block pool: coded block from a quantized pool");
  return allocate_packed();
}

bool BlockPool::can_allocate_packed() const {
  if (!free_.empty()) return true;  // a quantized pool's reserve serves packed blocks
  return std::any_of(slabs_by_free_.begin() + 1, slabs_by_free_.end(), [](const auto& s) { return !s.empty(); });
}

void BlockPool::set_slab_free_count(int32_t slot, int before, int after) {
  if (before > 0 && before < per_slot_) slabs_by_free_[size_t(before)].erase(slot);
  if (after > 0 && after < per_slot_) slabs_by_free_[size_t(after)].insert(slot);
}

int32_t BlockPool::allocate_packed() {
  int32_t slot = -1;
  for (size_t n = 1; n < slabs_by_free_.size() && slot < 0; ++n) {
    if (!slabs_by_free_[n].empty()) slot = *slabs_by_free_[n].begin();
  }
  if (slot < 0) {
    if (free_.empty()) throw std::runtime_error("block pool: no room for a packed (quantized or coded) KV block");
    slot = free_.back();
    free_.pop_back();
    is_free_[size_t(slot)] = false;
  }
  int sub = 0;
  while (slab_bits_[size_t(slot)] & (1u << sub)) ++sub;
  const int used = slab_used_[size_t(slot)];
  set_slab_free_count(slot, per_slot_ - used, per_slot_ - used - 1);
  slab_bits_[size_t(slot)] |= 1u << sub;
  slab_used_[size_t(slot)] = uint8_t(used + 1);
  const int32_t block = int32_t(n_slots_ + int64_t(slot) * per_slot_ + sub);
  holders_[size_t(block)] = 1;
  return block;
}

int32_t BlockPool::slot_of(int32_t block) const {
  if (block < 0 || block >= n_slots_ * (1 + per_slot_)) {
    throw std::logic_error("block pool: unknown block " + std::to_string(block));
  }
  return block < n_slots_ ? block : int32_t((block - n_slots_) / per_slot_);
}

void BlockPool::share(int32_t block) {
  slot_of(block);  // checks the id
  uint16_t& n = holders_[size_t(block)];
  if (n == 0) throw std::logic_error("block pool: block " + std::to_string(block) + " shared while free");
  if (n == UINT16_MAX) throw std::runtime_error("block pool: block " + std::to_string(block) + " has too many holders");
  ++n;
}

void BlockPool::release(int32_t block) {
  const int32_t slot = slot_of(block);
  if (holders_[size_t(block)] > 1) {
    --holders_[size_t(block)];
    return;
  }
  holders_[size_t(block)] = 0;
  if (block < n_slots_) {
    if (is_free_[size_t(block)] || slab_used_[size_t(block)] != 0) {
      throw std::logic_error("block pool: block " + std::to_string(block) + " released twice");
    }
  } else {
    const uint32_t bit = 1u << ((block - n_slots_) % per_slot_);
    if (!(slab_bits_[size_t(slot)] & bit)) {
      throw std::logic_error("block pool: block " + std::to_string(block) + " released twice");
    }
    const int used = slab_used_[size_t(slot)];
    slab_bits_[size_t(slot)] &= ~bit;
    slab_used_[size_t(slot)] = uint8_t(used - 1);
    set_slab_free_count(slot, per_slot_ - used, per_slot_ - used + 1);
    if (used > 1) return;  // the slab still holds other quantized blocks
  }
  is_free_[size_t(slot)] = true;
  free_.push_back(slot);
}

}  // namespace strata
