#pragma once
// A small f32 KV cache for the cache's tests, and tags: a distinct value written into every element of a
// layer's entries, so that a test can check where each entry went.
#include <cstdint>
#include <memory>
#include <numeric>
#include <vector>

#include <gtest/gtest.h>

#include "cache/block_pool.h"
#include "cache/kv_cache.h"
#include "kernels/backend.h"

namespace strata::kv_tags {

inline constexpr int kBlockSize = 4;

inline KvBlockLayout layout() {
  KvBlockLayout L;
  L.n_kv_heads = 2;
  L.head_dim = 3;
  L.block_size = kBlockSize;
  L.dtype = DType::f32;
  return L;  // 2 * 2 * 4 * 3 * 4 = 192 bytes a block
}

// A pool and a cache over the layers [begin, end).
struct Fixture {
  std::unique_ptr<Backend> be = make_cpu_backend();
  BlockPool pool;
  KvCache cache;
  Fixture(int64_t n_blocks, int begin, int end) : pool(*be, layout(), n_blocks), cache(pool, begin, end) {}
};

// The documented block layout (kernels/kv_block_layout.h): K [heads][slots][dim], then V the same.
inline float* k_at(const KvPoolView& view, const LayerKv& kv, int entry, int head) {
  const KvBlockLayout& L = view.layout;
  return view.block_f32(kv.block_table.at(size_t(entry / L.block_size))) +
         (int64_t(head) * L.block_size + entry % L.block_size) * L.head_dim;
}
inline float* v_at(const KvPoolView& view, const LayerKv& kv, int entry, int head) {
  const KvBlockLayout& L = view.layout;
  return k_at(view, kv, entry, head) + int64_t(L.n_kv_heads) * L.block_size * L.head_dim;
}
inline float tag(int layer, int entry, int head, int d, bool is_v) {
  return float(layer * 10000 + entry * 100 + head * 10 + d) + (is_v ? 0.5f : 0.0f);
}

// Writes a distinct value into every element of the entries a (sequence, layer) holds.
inline void write_tags(const KvCache& cache, SeqId seq, int layer) {
  const KvPoolView view = cache.pool_view();
  const LayerKv& kv = cache.layer(seq, layer);
  for (int e = 0; e < kv.n_entries; ++e) {
    for (int h = 0; h < view.layout.n_kv_heads; ++h) {
      for (int d = 0; d < view.layout.head_dim; ++d) {
        k_at(view, kv, e, h)[d] = tag(layer, e, h, d, false);
        v_at(view, kv, e, h)[d] = tag(layer, e, h, d, true);
      }
    }
  }
}

// Checks that entry j of the layer holds what entry original[j] held when write_tags ran.
inline void expect_tags(const KvCache& cache, SeqId seq, int layer, const std::vector<int32_t>& original) {
  const KvPoolView view = cache.pool_view();
  const LayerKv& kv = cache.layer(seq, layer);
  ASSERT_EQ(size_t(kv.n_entries), original.size());
  for (size_t j = 0; j < original.size(); ++j) {
    for (int h = 0; h < view.layout.n_kv_heads; ++h) {
      for (int d = 0; d < view.layout.head_dim; ++d) {
        ASSERT_EQ(k_at(view, kv, int(j), h)[d], tag(layer, original[j], h, d, false)) << "layer " << layer << " entry " << j;
        ASSERT_EQ(v_at(view, kv, int(j), h)[d], tag(layer, original[j], h, d, true)) << "layer " << layer << " entry " << j;
      }
    }
  }
}

inline std::vector<int32_t> iota_n(int n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

}  // namespace strata::kv_tags
