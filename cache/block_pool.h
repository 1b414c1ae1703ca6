#pragma once
// One rank's pool of fixed-size KV blocks, carved out at start-up from a memory budget. A block holds block_size
// entries of ONE layer (all of the rank's KV heads), so a block freed by one layer serves any layer or sequence.
#include <cstdint>
#include <vector>

#include "kernels/backend.h"
#include "kernels/kv_block_layout.h"

namespace strata {

class BlockPool {
 public:
  BlockPool(Backend& backend, KvBlockLayout layout, int64_t n_blocks);
  ~BlockPool();
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  // Blocks that fit in memory_bytes.
  static int64_t blocks_for_memory(const KvBlockLayout& layout, int64_t memory_bytes);

  int64_t n_total() const { return n_total_; }
  int64_t n_free() const { return int64_t(free_.size()); }
  bool can_allocate(int64_t n) const { return n <= n_free(); }
  int32_t allocate();  // throws std::runtime_error when the pool is empty (callers check can_allocate first)
  void release(int32_t block);

  const KvBlockLayout& layout() const { return layout_; }
  KvPoolView view() const { return KvPoolView{storage_.data, layout_}; }
  Backend& backend() const { return backend_; }

 private:
  Backend& backend_;
  KvBlockLayout layout_;
  int64_t n_total_;
  Tensor storage_;
  std::vector<int32_t> free_;  // a stack: the most recently freed block is reused first (warm in cache)
  std::vector<bool> is_free_;  // catches a block released twice, which would later be handed out twice
};

}  // namespace strata
