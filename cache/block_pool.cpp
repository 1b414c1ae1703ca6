#include "cache/block_pool.h"

#include <stdexcept>
#include <string>

namespace strata {

int64_t BlockPool::blocks_for_memory(const KvBlockLayout& layout, int64_t memory_bytes) {
  return memory_bytes / layout.block_bytes();
}

BlockPool::BlockPool(Backend& backend, KvBlockLayout layout, int64_t n_blocks)
    : backend_(backend), layout_(layout), n_total_(n_blocks) {
  if (n_blocks <= 0 || n_blocks > INT32_MAX) {
    throw std::invalid_argument("block pool: " + std::to_string(n_blocks) + " blocks is not a usable pool size");
  }
  storage_ = backend_.alloc(n_blocks, layout_.elements_per_block(), layout_.dtype);
  free_.reserve(size_t(n_blocks));
  for (int64_t b = n_blocks - 1; b >= 0; --b) free_.push_back(int32_t(b));
  is_free_.assign(size_t(n_blocks), true);
}

BlockPool::~BlockPool() { backend_.free(storage_); }

int32_t BlockPool::allocate() {
  if (free_.empty()) throw std::runtime_error("block pool: no free KV block");
  const int32_t b = free_.back();
  free_.pop_back();
  is_free_[size_t(b)] = false;
  return b;
}

void BlockPool::release(int32_t block) {
  if (block < 0 || block >= n_total_) throw std::logic_error("block pool: releasing an unknown block");
  if (is_free_[size_t(block)]) throw std::logic_error("block pool: block " + std::to_string(block) + " released twice");
  is_free_[size_t(block)] = true;
  free_.push_back(block);
}

}  // namespace strata
