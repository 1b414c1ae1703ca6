#pragma once
// Where the keys and values of one KV block live. A block holds `block_size` consecutive cache entries of one
// layer for all of a rank's KV heads:
//   K: [n_kv_heads][block_size][head_dim]  then  V: [n_kv_heads][block_size][head_dim]
// Head-major inside a block so that one head's keys are contiguous for the attention dot products.
#include <cstdint>

#include "kernels/tensor.h"

namespace strata {

struct KvBlockLayout {
  int n_kv_heads = 0;   // KV heads on this rank
  int head_dim = 0;
  int block_size = 16;  // cache entries per block
  DType dtype = DType::f32;

  int64_t elements_per_block() const { return 2LL * n_kv_heads * block_size * head_dim; }
  int64_t block_bytes() const { return elements_per_block() * dtype_bytes(dtype); }
  // Bytes one cache entry takes in one layer, K and V together.
  int64_t entry_bytes() const { return 2LL * n_kv_heads * head_dim * dtype_bytes(dtype); }
  int64_t k_offset(int head, int slot) const { return (int64_t(head) * block_size + slot) * head_dim; }
  int64_t v_offset(int head, int slot) const {
    return int64_t(n_kv_heads) * block_size * head_dim + k_offset(head, slot);
  }
};

// One layer's view of the pool for one step: the pool's base and layout. Block tables index into it.
struct KvPoolView {
  void* base = nullptr;
  KvBlockLayout layout;
  float* block_f32(int32_t block) const {
    return static_cast<float*>(base) + int64_t(block) * layout.elements_per_block();
  }
};

}  // namespace strata
