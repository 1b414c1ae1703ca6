#include "cache/kv_cache.h"

#include <cstdint>
#include <map>
#include <memory>
#include <numeric>
#include <set>
#include <stdexcept>
#include <vector>

#include <gtest/gtest.h>

#include "cache/block_pool.h"
#include "kernels/backend.h"
#include "tests/cache/kv_tags.h"

namespace strata {
namespace {

using namespace kv_tags;

TEST(KvCache, RejectsAnEmptyLayerRange) {
  auto be = make_cpu_backend();
  BlockPool pool(*be, layout(), 4);
  EXPECT_THROW(KvCache(pool, 3, 3), std::invalid_argument);
  EXPECT_THROW(KvCache(pool, 5, 2), std::invalid_argument);
}

TEST(KvCache, BlocksToAppendForANewSequence) {
  Fixture f(40, 0, 3);
  EXPECT_EQ(f.cache.n_layers(), 3);
  EXPECT_EQ(f.cache.block_size(), kBlockSize);
  EXPECT_FALSE(f.cache.contains(7));
  EXPECT_EQ(f.cache.blocks_to_append(7, 0), 0);
  EXPECT_EQ(f.cache.blocks_to_append(7, 1), 3);  // one block in each of the 3 layers
  EXPECT_EQ(f.cache.blocks_to_append(7, 4), 3);
  EXPECT_EQ(f.cache.blocks_to_append(7, 5), 6);
  EXPECT_EQ(f.cache.blocks_to_append(7, 13), 12);
  EXPECT_TRUE(f.cache.can_append(7, 52));    // 13 blocks * 3 layers = 39 <= 40
  EXPECT_FALSE(f.cache.can_append(7, 53));   // 14 * 3 = 42 > 40
  EXPECT_EQ(f.cache.blocks_held(7), 0);
  EXPECT_EQ(f.pool.n_free(), 40);  // queries change nothing
}

TEST(KvCache, BlocksToAppendForAnExistingSequenceAcrossABlockBoundary) {
  Fixture f(40, 0, 3);
  f.cache.append(1, 3);  // 3 of 4 slots in each layer's first block
  EXPECT_EQ(f.cache.blocks_to_append(1, 0), 0);
  EXPECT_EQ(f.cache.blocks_to_append(1, 1), 0);  // fills the block
  EXPECT_EQ(f.cache.blocks_to_append(1, 2), 3);  // crosses into a second block in every layer
  EXPECT_EQ(f.cache.blocks_to_append(1, 5), 3);
  EXPECT_EQ(f.cache.blocks_to_append(1, 6), 6);
  f.cache.append(1, 1);  // exactly full
  EXPECT_EQ(f.cache.blocks_to_append(1, 1), 3);
}

TEST(KvCache, AppendReservesEntriesInEveryLayer) {
  Fixture f(40, 0, 3);
  const int64_t need = f.cache.blocks_to_append(5, 6);
  f.cache.append(5, 6);
  EXPECT_TRUE(f.cache.contains(5));
  EXPECT_EQ(f.pool.n_free(), 40 - need);
  EXPECT_EQ(f.cache.blocks_held(5), need);
  std::set<int32_t> blocks;
  for (int l = 0; l < 3; ++l) {
    const LayerKv& kv = f.cache.layer(5, l);
    EXPECT_EQ(kv.n_entries, 6);
    EXPECT_EQ(kv.n_appended, 6);
    EXPECT_EQ(kv.block_table.size(), 2u);
    for (int32_t b : kv.block_table) EXPECT_TRUE(blocks.insert(b).second) << "block " << b << " in two places";
  }
  f.cache.append(5, 3);
  for (int l = 0; l < 3; ++l) {
    EXPECT_EQ(f.cache.layer(5, l).n_entries, 9);
    EXPECT_EQ(f.cache.layer(5, l).block_table.size(), 3u);
    // Appending keeps the blocks already there, in order.
    EXPECT_EQ(blocks.count(f.cache.layer(5, l).block_table[0]), 1u);
    EXPECT_EQ(blocks.count(f.cache.layer(5, l).block_table[1]), 1u);
  }
  EXPECT_EQ(f.pool.n_free(), 40 - 9);
}

TEST(KvCache, AppendThatDoesNotFitThrowsAndChangesNothing) {
  Fixture f(5, 0, 2);
  EXPECT_THROW(f.cache.append(1, 12), std::runtime_error);  // 3 blocks * 2 layers > 5
  EXPECT_FALSE(f.cache.contains(1));
  EXPECT_EQ(f.pool.n_free(), 5);
  f.cache.append(1, 8);  // 4 blocks
  EXPECT_THROW(f.cache.append(1, 1), std::runtime_error);  // 2 more, 1 free
  EXPECT_EQ(f.cache.layer(1, 0).n_entries, 8);
  EXPECT_EQ(f.cache.layer(1, 1).n_entries, 8);
  EXPECT_EQ(f.pool.n_free(), 1);
  EXPECT_THROW(f.cache.append(1, -1), std::invalid_argument);
}

TEST(KvCache, LayerUsageCountsEntriesBlocksAndBytes) {
  Fixture f(40, 0, 2);
  const int64_t block_bytes = layout().block_bytes();
  ASSERT_EQ(block_bytes, 192);
  f.cache.append(1, 5);  // 2 blocks per layer
  f.cache.append(2, 4);  // 1 block per layer
  for (int l = 0; l < 2; ++l) {
    const LayerUsage u = f.cache.layer_usage(l);
    EXPECT_EQ(u.entries, 9);
    EXPECT_EQ(u.blocks, 3);
    EXPECT_EQ(u.bytes, 3 * block_bytes);
    EXPECT_EQ(u.uncompressed_bytes, 3 * block_bytes);
  }
  const LayerUsage empty = Fixture(4, 0, 1).cache.layer_usage(0);
  EXPECT_EQ(empty.entries, 0);
  EXPECT_EQ(empty.blocks, 0);
  EXPECT_EQ(empty.bytes, 0);
  EXPECT_EQ(empty.uncompressed_bytes, 0);
}

TEST(KvCache, RetainCompactsAndFreesTrailingBlocksAtOnce) {
  Fixture f(40, 0, 2);
  f.cache.append(1, 10);  // 3 blocks per layer
  f.cache.append(2, 6);   // another sequence around it
  for (int l = 0; l < 2; ++l) {
    write_tags(f.cache, 1, l);
    write_tags(f.cache, 2, l);
  }
  const int64_t free_before = f.pool.n_free();
  const LayerUsage before = f.cache.layer_usage(1);
  const std::vector<int32_t> kept = {1, 4, 6, 9};  // 4 entries: one block

  f.cache.retain(1, 1, kept);

  EXPECT_EQ(f.pool.n_free(), free_before + 2);  // two trailing blocks back in the pool at once
  const LayerKv& kv = f.cache.layer(1, 1);
  EXPECT_EQ(kv.n_entries, 4);
  EXPECT_EQ(kv.n_appended, 10);
  EXPECT_EQ(kv.block_table.size(), 1u);
  expect_tags(f.cache, 1, 1, kept);  // the data moved to the front
  // The other layer and the other sequence are untouched.
  expect_tags(f.cache, 1, 0, iota_n(10));
  expect_tags(f.cache, 2, 0, iota_n(6));
  expect_tags(f.cache, 2, 1, iota_n(6));

  const LayerUsage after = f.cache.layer_usage(1);
  EXPECT_EQ(after.entries, before.entries - 6);
  EXPECT_EQ(after.blocks, before.blocks - 2);
  EXPECT_EQ(after.bytes, after.blocks * layout().block_bytes());
  EXPECT_EQ(after.uncompressed_bytes, before.uncompressed_bytes);  // what `full` would hold has not changed
  EXPECT_LT(after.bytes, after.uncompressed_bytes);
  const LayerUsage other = f.cache.layer_usage(0);
  EXPECT_EQ(other.entries, 16);
  EXPECT_EQ(other.blocks, 5);
}

// Chunked prefill's scoring rows: the last entries appended leave the layer as if never appended; the blocks past
// the rest go back, the entries before them keep their data.
TEST(KvCache, DropAppendedTakesBackTheLastEntries) {
  Fixture f(40, 0, 2);
  f.cache.append(1, 6);
  f.cache.append(1, 5);  // 11 entries: 3 blocks per layer
  for (int l = 0; l < 2; ++l) write_tags(f.cache, 1, l);
  const int64_t free_before = f.pool.n_free();
  const LayerUsage before = f.cache.layer_usage(0);

  f.cache.drop_appended(1, 0, 5);

  const LayerKv& kv = f.cache.layer(1, 0);
  EXPECT_EQ(kv.n_entries, 6);
  EXPECT_EQ(kv.n_appended, 6);
  EXPECT_EQ(kv.block_table.size(), 2u);
  EXPECT_EQ(f.pool.n_free(), free_before + 1);
  expect_tags(f.cache, 1, 0, iota_n(6));
  expect_tags(f.cache, 1, 1, iota_n(11));  // the other layer keeps its own
  const LayerUsage after = f.cache.layer_usage(0);
  EXPECT_EQ(after.entries, before.entries - 5);
  EXPECT_EQ(after.blocks, before.blocks - 1);
  EXPECT_EQ(after.uncompressed_bytes, 2 * layout().block_bytes()) << "`full` would not hold them either";
  EXPECT_THROW(f.cache.drop_appended(1, 0, 7), std::logic_error) << "more than the layer holds";
  f.cache.drop_appended(1, 0, 6);
  EXPECT_EQ(f.cache.layer(1, 0).block_table.size(), 0u);
}

// The peak is what the sequence held at its most, over all layers: a retain lowers what it holds, not its peak,
// and a later append counts from what it holds.
TEST(KvCache, PeakBytesIsTheMostASequenceHeld) {
  Fixture f(40, 0, 2);
  const int64_t block = layout().block_bytes();
  f.cache.append(1, 10);  // 3 blocks per layer
  EXPECT_EQ(f.cache.peak(1).bytes, 2 * 3 * block);
  f.cache.retain(1, 0, std::vector<int32_t>{0, 1});
  f.cache.retain(1, 1, std::vector<int32_t>{0, 1});
  EXPECT_EQ(f.cache.peak(1).bytes, 2 * 3 * block);
  f.cache.append(1, 6);  // 8 entries: 2 blocks per layer
  EXPECT_EQ(f.cache.peak(1).bytes, 2 * 3 * block);
  f.cache.append(1, 8);  // 16 entries: 4 blocks per layer
  EXPECT_EQ(f.cache.peak(1).bytes, 2 * 4 * block);
  EXPECT_EQ(f.cache.peak(1).full_precision_bytes, 2 * 4 * block);  // a full-precision pool holds nothing else
  EXPECT_EQ(f.cache.peak(2).bytes, 0);  // no such sequence
  f.cache.release(1);
  EXPECT_EQ(f.cache.peak(1).bytes, 0);
}

TEST(KvCache, RetainKeepingAllOrNone) {
  Fixture f(40, 0, 1);
  f.cache.append(1, 7);
  write_tags(f.cache, 1, 0);
  const int64_t free_before = f.pool.n_free();
  f.cache.retain(1, 0, iota_n(7));
  EXPECT_EQ(f.pool.n_free(), free_before);
  expect_tags(f.cache, 1, 0, iota_n(7));

  f.cache.retain(1, 0, std::vector<int32_t>{});
  EXPECT_EQ(f.cache.layer(1, 0).n_entries, 0);
  EXPECT_TRUE(f.cache.layer(1, 0).block_table.empty());
  EXPECT_EQ(f.pool.n_free(), free_before + 2);
  EXPECT_EQ(f.cache.layer_usage(0).entries, 0);
  EXPECT_EQ(f.cache.layer_usage(0).blocks, 0);
  EXPECT_EQ(f.cache.layer_usage(0).uncompressed_bytes, 2 * layout().block_bytes());
  EXPECT_TRUE(f.cache.contains(1));
}

TEST(KvCache, RetainThenAppendCountsFromTheEntriesHeld) {
  Fixture f(40, 0, 2);
  f.cache.append(1, 10);                      // 3 blocks per layer (12 slots)
  f.cache.retain(1, 0, std::vector<int32_t>{0, 1, 2, 3});         // layer 0: 4 entries, 1 full block
  EXPECT_EQ(f.cache.blocks_to_append(1, 1), 1);  // layer 0 needs a block, layer 1 has 2 free slots
  EXPECT_EQ(f.cache.blocks_to_append(1, 3), 2);
  f.cache.append(1, 3);
  EXPECT_EQ(f.cache.layer(1, 0).n_entries, 7);
  EXPECT_EQ(f.cache.layer(1, 0).block_table.size(), 2u);
  EXPECT_EQ(f.cache.layer(1, 1).n_entries, 13);
  EXPECT_EQ(f.cache.layer(1, 1).block_table.size(), 4u);
  EXPECT_EQ(f.cache.layer(1, 0).n_appended, 13);
  // uncompressed: 13 entries -> 4 blocks in both layers
  EXPECT_EQ(f.cache.layer_usage(0).uncompressed_bytes, 4 * layout().block_bytes());
  EXPECT_EQ(f.cache.layer_usage(1).uncompressed_bytes, 4 * layout().block_bytes());
  EXPECT_EQ(f.cache.layer_usage(0).bytes, 2 * layout().block_bytes());
}

TEST(KvCache, RetainRejectsBadSelectionsAndChangesNothing) {
  Fixture f(40, 0, 1);
  f.cache.append(1, 6);
  write_tags(f.cache, 1, 0);
  const int64_t free_before = f.pool.n_free();
  const std::vector<std::vector<int32_t>> bad = {
      {2, 1},        // descending
      {0, 3, 3},     // repeated
      {0, 6},        // past the entries held
      {-1, 2},       // negative
      {5, 0, 1},     // unsorted
  };
  for (const auto& kept : bad) {
    EXPECT_THROW(f.cache.retain(1, 0, kept), std::invalid_argument) << "kept[0] = " << kept[0];
    EXPECT_EQ(f.pool.n_free(), free_before);
    expect_tags(f.cache, 1, 0, iota_n(6));
  }
  EXPECT_THROW(f.cache.retain(99, 0, std::vector<int32_t>{0}), std::out_of_range);  // unknown sequence
}

TEST(KvCache, ReleaseReturnsEveryBlock) {
  Fixture f(40, 0, 3);
  f.cache.append(1, 9);
  f.cache.append(2, 2);
  f.cache.retain(1, 2, std::vector<int32_t>{0, 8});
  const int64_t held = f.cache.blocks_held(1);
  EXPECT_EQ(held, 3 + 3 + 1);
  const int64_t free_before = f.pool.n_free();
  f.cache.release(1);
  EXPECT_FALSE(f.cache.contains(1));
  EXPECT_EQ(f.pool.n_free(), free_before + held);
  EXPECT_EQ(f.cache.blocks_held(1), 0);
  EXPECT_THROW(f.cache.layer(1, 0), std::out_of_range);
  for (int l = 0; l < 3; ++l) {
    EXPECT_EQ(f.cache.layer_usage(l).entries, 2);
    EXPECT_EQ(f.cache.layer_usage(l).blocks, 1);
    EXPECT_EQ(f.cache.layer_usage(l).uncompressed_bytes, layout().block_bytes());
  }
  f.cache.release(1);  // releasing twice, or an unknown sequence, is harmless
  f.cache.release(12345);
  f.cache.release(2);
  EXPECT_EQ(f.pool.n_free(), 40);
  for (int l = 0; l < 3; ++l) {
    const LayerUsage u = f.cache.layer_usage(l);
    EXPECT_EQ(u.entries, 0);
    EXPECT_EQ(u.blocks, 0);
    EXPECT_EQ(u.bytes, 0);
    EXPECT_EQ(u.uncompressed_bytes, 0);
  }
}

TEST(KvCache, DestructionGivesEveryBlockBack) {
  auto be = make_cpu_backend();
  BlockPool pool(*be, layout(), 20);
  {
    KvCache cache(pool, 0, 2);
    cache.append(1, 5);
    cache.append(2, 9);
    EXPECT_LT(pool.n_free(), 20);
  }
  EXPECT_EQ(pool.n_free(), 20);
}

TEST(KvCache, InterleavedSequencesKeepTheirOwnBlocksAndData) {
  Fixture f(60, 0, 2);
  // Appends in an interleaved order, as decode steps of several sequences do.
  const std::vector<std::pair<SeqId, int>> steps = {{1, 3}, {2, 5}, {1, 2}, {3, 1}, {2, 7}, {3, 4}, {1, 1}, {3, 3}};
  std::map<SeqId, int> expected;
  for (const auto& [seq, n] : steps) {
    const int64_t need = f.cache.blocks_to_append(seq, n);
    const int64_t free_before = f.pool.n_free();
    f.cache.append(seq, n);
    EXPECT_EQ(f.pool.n_free(), free_before - need);
    expected[seq] += n;
  }
  std::set<int32_t> all;
  int64_t held = 0;
  for (const auto& [seq, n] : expected) {
    for (int l = 0; l < 2; ++l) {
      const LayerKv& kv = f.cache.layer(seq, l);
      EXPECT_EQ(kv.n_entries, n);
      EXPECT_EQ(int64_t(kv.block_table.size()), (n + kBlockSize - 1) / kBlockSize);
      for (int32_t b : kv.block_table) EXPECT_TRUE(all.insert(b).second) << "block " << b << " shared";
      write_tags(f.cache, seq, l);
    }
    held += f.cache.blocks_held(seq);
  }
  EXPECT_EQ(f.pool.n_free(), 60 - held);
  for (int l = 0; l < 2; ++l) EXPECT_EQ(f.cache.layer_usage(l).entries, 6 + 12 + 8);
  // Writing every sequence's data did not clobber any other's.
  for (const auto& [seq, n] : expected) {
    for (int l = 0; l < 2; ++l) expect_tags(f.cache, seq, l, iota_n(n));
  }
  // Releasing the middle one leaves the others whole, and its blocks serve a new sequence.
  f.cache.release(2);
  expect_tags(f.cache, 1, 0, iota_n(6));
  expect_tags(f.cache, 3, 1, iota_n(8));
  f.cache.append(4, 12);
  EXPECT_EQ(f.cache.layer(4, 0).n_entries, 12);
  EXPECT_EQ(f.pool.n_free(), 60 - f.cache.blocks_held(1) - f.cache.blocks_held(3) - f.cache.blocks_held(4));
}

TEST(KvCache, PipelineStageHoldsOnlyItsLayers) {
  Fixture f(100, 10, 20);
  EXPECT_EQ(f.cache.layer_begin(), 10);
  EXPECT_EQ(f.cache.layer_end(), 20);
  EXPECT_EQ(f.cache.n_layers(), 10);
  EXPECT_EQ(f.cache.blocks_to_append(1, 5), 20);  // 2 blocks in each of 10 layers
  f.cache.append(1, 5);
  EXPECT_EQ(f.cache.blocks_held(1), 20);
  for (int l = 10; l < 20; ++l) {
    EXPECT_EQ(f.cache.layer(1, l).n_entries, 5) << l;
    EXPECT_EQ(f.cache.layer_usage(l).entries, 5) << l;
  }
  for (int l : {0, 9, 20, 21, -1}) {
    EXPECT_THROW(f.cache.layer(1, l), std::out_of_range) << l;
    EXPECT_THROW(f.cache.layer_usage(l), std::out_of_range) << l;
    EXPECT_THROW(f.cache.retain(1, l, std::vector<int32_t>{0}), std::out_of_range) << l;
  }
  // Retain on a held layer works with global indices.
  write_tags(f.cache, 1, 19);
  f.cache.retain(1, 19, std::vector<int32_t>{4});
  expect_tags(f.cache, 1, 19, std::vector<int32_t>{4});
  EXPECT_EQ(f.cache.layer(1, 19).block_table.size(), 1u);
  EXPECT_EQ(f.cache.layer(1, 10).n_entries, 5);
  EXPECT_EQ(f.pool.n_free(), 100 - 19);
}

// Per-KV-head selections: each head keeps its own entries, all heads the same count.
TEST(KvCache, RetainPerHeadKeepsEachHeadsOwnEntries) {
  std::unique_ptr<Backend> backend = make_cpu_backend();
  const KvBlockLayout layout{2, 4, 4, DType::f32};
  BlockPool pool(*backend, layout, 16);
  KvCache cache(pool, 0, 1);
  cache.append(1, 10);
  const KvPoolView view = pool.view();
  const LayerKv& kv = cache.layer(1, 0);
  auto key = [&](int head, int entry) {
    return view.block_f32(kv.block_table[size_t(entry / 4)]) + layout.k_offset(head, entry % 4);
  };
  for (int h = 0; h < 2; ++h) {
    for (int e = 0; e < 10; ++e) key(h, e)[0] = float(100 * h + e);  // tag each key by (head, entry)
  }
  const std::vector<std::vector<int32_t>> kept = {{0, 3, 9}, {1, 2, 8}};
  cache.retain(1, 0, kept);
  EXPECT_EQ(cache.layer(1, 0).n_entries, 3);
  EXPECT_EQ(cache.layer(1, 0).block_table.size(), 1u);
  EXPECT_EQ(pool.n_free(), 15);
  for (int h = 0; h < 2; ++h) {
    for (int j = 0; j < 3; ++j) EXPECT_EQ(key(h, j)[0], float(100 * h + kept[size_t(h)][size_t(j)]));
  }
  const std::vector<std::vector<int32_t>> uneven = {{0, 1}, {0}};
  EXPECT_THROW(cache.retain(1, 0, uneven), std::invalid_argument);
  const std::vector<std::vector<int32_t>> three = {{0}, {0}, {0}};
  EXPECT_THROW(cache.retain(1, 0, three), std::invalid_argument);
}

}  // namespace
}  // namespace strata
