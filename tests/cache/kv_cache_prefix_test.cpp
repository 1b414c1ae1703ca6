// Prefix caching in the KV cache (cache/kv_cache.h): published blocks outlive their sequence until evicted, a new
// sequence starts from them, and whatever a policy does to a sequence's entries (compaction, merges, PoD pairing,
// sealing) changes its own copy, never the cached block.
#include <cstdint>
#include <stdexcept>
#include <vector>

#include <gtest/gtest.h>

#include "cache/block_pool.h"
#include "cache/kv_cache.h"
#include "kernels/backend.h"
#include "kernels/kv_merge.h"
#include "tests/cache/kv_tags.h"

namespace strata {
namespace {

using namespace kv_tags;

// Sequence 1 holds 10 tagged entries in layers 0 and 1 and publishes its two full blocks as hashes 11 and 12.
struct Published : Fixture {
  Published() : Fixture(16, 0, 2) {
    cache.append(1, 10);
    for (int l = 0; l < 2; ++l) write_tags(cache, 1, l);
    cache.publish(1, 0, 11);
    cache.publish(1, 1, 12);
  }
  const std::vector<uint64_t> chain = {11, 12};
};

TEST(KvCachePrefix, PublishedBlocksOutliveTheirSequenceUntilEvicted) {
  Published f;
  EXPECT_EQ(f.pool.n_free(), 16 - 6);
  EXPECT_EQ(f.cache.blocks_held(1), 2) << "the last, partial block of each layer; the published ones stay";
  f.cache.release(1);
  EXPECT_EQ(f.pool.n_free(), 16 - 4);
  EXPECT_EQ(f.cache.n_cached_blocks(), 2);
  f.cache.evict(f.chain);
  EXPECT_EQ(f.pool.n_free(), 16);
  EXPECT_FALSE(f.cache.is_cached(11));
  EXPECT_THROW(f.cache.evict(f.chain), std::logic_error);
}

TEST(KvCachePrefix, ANewSequenceStartsFromTheCachedEntries) {
  Published f;
  f.cache.release(1);
  f.cache.start_from_prefix(2, f.chain);
  for (int l = 0; l < 2; ++l) expect_tags(f.cache, 2, l, iota_n(8));
  EXPECT_EQ(f.cache.blocks_held(2), 0);
  EXPECT_EQ(f.cache.blocks_to_append(2, 1), 2) << "a new block per layer: the cached ones are full";
  f.cache.append(2, 1);
  EXPECT_EQ(f.cache.layer(2, 0).n_entries, 9);
  EXPECT_EQ(f.cache.layer_usage(0).entries, 9);
  EXPECT_THROW(f.cache.start_from_prefix(2, f.chain), std::logic_error) << "already started";
  EXPECT_THROW(f.cache.start_from_prefix(3, std::vector<uint64_t>{99}), std::logic_error) << "not cached";
  f.cache.release(2);
  f.cache.evict(f.chain);
  EXPECT_EQ(f.pool.n_free(), 16);
}

TEST(KvCachePrefix, ASequenceMayStartFromCopiesOfItsOwn) {
  Published f;
  f.cache.release(1);
  const int64_t free_before = f.pool.n_free();
  f.cache.start_from_prefix(2, f.chain, /*copy=*/true);
  EXPECT_EQ(f.pool.n_free(), free_before - 4) << "two blocks in each of two layers";
  EXPECT_EQ(f.cache.blocks_held(2), 4);
  for (int l = 0; l < 2; ++l) {
    expect_tags(f.cache, 2, l, iota_n(8));
    for (int32_t b : f.cache.layer(2, l).block_table) EXPECT_EQ(f.pool.holders(b), 1);
  }
  f.cache.release(2);
  f.cache.evict(f.chain);
  EXPECT_EQ(f.pool.n_free(), 16);
}

// strata eval's shared prefill: a fork holds copies of the source's first entries, its own from the start.
TEST(KvCachePrefix, AForkStartsWithCopiesOfItsSourcesFirstEntries) {
  Fixture f(16, 0, 2);
  f.cache.append(1, 10);
  for (int l = 0; l < 2; ++l) write_tags(f.cache, 1, l);
  f.cache.fork(1, 2, 9);  // 4 + 4 + 1 entries: the partial block is copied too
  f.cache.fork(1, 3, 4);
  EXPECT_EQ(f.pool.n_free(), 16 - 6 - 6 - 2);
  f.cache.release(1);
  for (int l = 0; l < 2; ++l) {
    expect_tags(f.cache, 2, l, iota_n(9));
    expect_tags(f.cache, 3, l, iota_n(4));
    for (int32_t b : f.cache.layer(2, l).block_table) EXPECT_EQ(f.pool.holders(b), 1);
  }
  f.cache.append(2, 3);  // into its own copy of the partial block
  EXPECT_EQ(f.cache.layer(2, 1).n_entries, 12);
  EXPECT_THROW(f.cache.fork(2, 4, 13), std::logic_error) << "more entries than the source holds";
  EXPECT_THROW(f.cache.fork(9, 4, 1), std::logic_error) << "no such source";
  f.cache.retain(2, 0, std::vector<int32_t>{0, 5});
  EXPECT_THROW(f.cache.fork(2, 4, 2), std::logic_error) << "a compacted source no longer holds its entries as written";
  f.cache.release(2);
  f.cache.release(3);
  EXPECT_EQ(f.pool.n_free(), 16);
}

TEST(KvCachePrefix, CompactionWritesIntoCopies) {
  Published f;
  f.cache.start_from_prefix(2, f.chain);
  f.cache.append(2, 2);
  for (int l = 0; l < 2; ++l) write_tags(f.cache, 2, l);  // the same tags: entries 8, 9 are new
  const std::vector<int32_t> kept = {1, 5, 8, 9};
  f.cache.retain(2, 0, kept);
  expect_tags(f.cache, 2, 0, kept);
  expect_tags(f.cache, 1, 0, iota_n(10));  // the publisher's blocks, shared with the cache, are as they were
  EXPECT_NE(f.cache.layer(2, 0).block_table[0], f.cache.layer(1, 0).block_table[0]);
  EXPECT_EQ(f.cache.layer(2, 1).block_table[0], f.cache.layer(1, 1).block_table[0]) << "layer 1 still shares";
  EXPECT_FALSE(f.cache.can_publish(2, 1)) << "layer 0 was compacted: no block of it is the prompt's";
  f.cache.release(1);
  f.cache.release(2);
  f.cache.evict(f.chain);
  EXPECT_EQ(f.pool.n_free(), 16);
}

TEST(KvCachePrefix, MergesAndPairsWriteIntoCopies) {
  Published f;
  f.cache.start_from_prefix(2, f.chain);
  std::vector<KvMerges> merges(2);
  for (KvMerges& m : merges) m.add(/*target=*/0, /*target_weight=*/0.5f, /*sources=*/{3}, /*weights=*/{0.5f});
  f.cache.merge(2, 0, merges);
  expect_tags(f.cache, 1, 0, iota_n(10));
  const float merged = k_at(f.cache.pool_view(), f.cache.layer(2, 0), 0, 1)[2];
  EXPECT_FLOAT_EQ(merged, 0.5f * tag(0, 0, 1, 2, false) + 0.5f * tag(0, 3, 1, 2, false));
  f.cache.pair_key_free_blocks(2, 1, 0, 8);
  expect_tags(f.cache, 1, 1, iota_n(10));
  EXPECT_EQ(f.cache.layer(2, 1).n_paired, 1);
}

// In a quantized pool the cache keeps the published block at full precision; sealing gives the sequence its own
// quantized copy, and a sequence started from the prefix reads the entries as they were written.
TEST(KvCachePrefix, SealingLeavesTheCachedBlockAtFullPrecision) {
  KvBlockLayout L;
  L.n_kv_heads = 2;
  L.head_dim = 32;
  L.block_size = 32;
  L.quant = KvQuant::int8;
  auto be = make_cpu_backend();
  BlockPool pool(*be, L, 8);
  KvCache cache(pool, 0, 1);
  cache.append(1, 40);
  const KvPoolView view = cache.pool_view();
  const int64_t block_floats = L.elements_per_block();
  float* written = view.block_f32(cache.layer(1, 0).block_table[0]);
  for (int64_t i = 0; i < block_floats; ++i) written[i] = float(i % 97) * 0.01f - 0.3f;
  const std::vector<float> original(written, written + block_floats);
  cache.publish(1, 0, 7);
  EXPECT_EQ(cache.seal(1, 0), 1);
  EXPECT_EQ(cache.layer(1, 0).n_quantized_blocks, 1);
  cache.start_from_prefix(2, std::vector<uint64_t>{7});
  const int32_t cached = cache.layer(2, 0).block_table[0];
  EXPECT_FALSE(pool.is_quantized(cached));
  EXPECT_EQ(std::vector<float>(view.block_f32(cached), view.block_f32(cached) + block_floats), original);
  cache.release(1);
  cache.release(2);
  cache.evict(std::vector<uint64_t>{7});
  EXPECT_EQ(pool.n_free(), pool.n_total());
}

TEST(KvCachePrefix, OnlyBlocksAsWrittenArePublished) {
  Fixture f(16, 0, 1);
  f.cache.append(1, 9);
  EXPECT_TRUE(f.cache.can_publish(1, 1));
  EXPECT_FALSE(f.cache.can_publish(1, 2)) << "partial";
  EXPECT_FALSE(f.cache.can_publish(2, 0)) << "unknown sequence";
  f.cache.retain(1, 0, iota_n(9));  // keeps everything: still as written
  EXPECT_TRUE(f.cache.can_publish(1, 0));
  f.cache.retain(1, 0, iota_n(8));
  EXPECT_FALSE(f.cache.can_publish(1, 0));
  EXPECT_THROW(f.cache.publish(1, 0, 5), std::logic_error);
}

}  // namespace
}  // namespace strata
