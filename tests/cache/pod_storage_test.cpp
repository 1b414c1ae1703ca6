// PoD storage (KvCache::pair_key_free_blocks, docs/compression.md "PoD"): pairs of whole blocks inside the
// key-free range share one block, the values of the second in the key region of the first; the freed blocks are
// back in the pool and the accounting says so; release gives every block back exactly once.
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "cache/block_pool.h"
#include "cache/kv_cache.h"
#include "cache/storage_observations.h"
#include "kernels/backend.h"

namespace strata {
namespace {

TEST(PodStorage, PairsWholeBlocksAndFreesTheSecond) {
  std::unique_ptr<Backend> be = make_cpu_backend();
  const KvBlockLayout L{1, 2, 4, DType::f32};  // 1 KV head of 2, 4 entries a block: 16 floats
  BlockPool pool(*be, L, 20);
  KvCache cache(pool, 0, 1);
  cache.append(7, 26);  // 7 blocks, entries 0..25
  const KvPoolView view = cache.pool_view();
  for (int e = 0; e < 26; ++e) {  // value of entry e, channel c = 100 e + c
    const int32_t id = cache.layer(7, 0).block_table[size_t(e / 4)];
    for (int c = 0; c < 2; ++c) view.block_f32(id)[L.v_offset(0, e % 4) + c] = float(100 * e + c);
  }
  const int64_t free_before = pool.n_free();
  // Key-free entries [2, 21): blocks wholly inside from the first boundary at or after 2 are 1..4 (entries
  // 4..19): pairs (1, 2) and (3, 4).
  EXPECT_EQ(cache.pair_key_free_blocks(7, 0, 2, 21), 2);
  EXPECT_EQ(pool.n_free(), free_before + 2);
  const LayerKv& kv = cache.layer(7, 0);
  EXPECT_EQ(kv.n_paired, 2);
  EXPECT_EQ(kv.block_table[2], pod_paired_id(kv.block_table[1]));
  EXPECT_EQ(kv.block_table[4], pod_paired_id(kv.block_table[3]));
  EXPECT_EQ(cache.sequence_usage(7, 0).blocks, 5);
  EXPECT_EQ(cache.layer_usage(0).bytes, 5 * L.block_bytes());
  EXPECT_EQ(cache.blocks_held(7), 5);
  EXPECT_EQ(cache.sequence_usage(7, 0).shared_key_entries, 16);  // two pairs of two 4-entry blocks lost their keys
  EXPECT_EQ(cache.layer_usage(0).shared_key_entries, 16);
  std::vector<Observation> layer_observed, sequence_observed;  // as the reports carry them
  observe_layer_storage(cache.layer_usage(0), layer_observed);
  observe_sequence_storage(cache, 7, 0, sequence_observed);
  EXPECT_EQ(layer_observed, (std::vector<Observation>{{"shared_keys", 16}}));
  EXPECT_EQ(sequence_observed, layer_observed);
  // Entry 9 (block 2, slot 1) now lives in the key region of block 1.
  EXPECT_EQ(view.block_f32(kv.block_table[1])[L.k_offset(0, 1) + 1], 901.0f);
  EXPECT_EQ(view.block_f32(kv.block_table[1])[L.v_offset(0, 1)], 500.0f);  // block 1's own values stay
  // Nothing more to pair until the range grows by two whole blocks; then block 5 and 6 would pair.
  EXPECT_EQ(cache.pair_key_free_blocks(7, 0, 2, 27), 0);
  cache.release(7);
  EXPECT_EQ(pool.n_free(), 20);
  EXPECT_EQ(cache.layer_usage(0).shared_key_entries, 0);
}

}  // namespace
}  // namespace strata
