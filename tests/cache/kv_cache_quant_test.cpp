// A quantized KV pool (kv_cache.dtype int8 | int4 | int2): the block pool packs quantized blocks into slabs of one slot
// and keeps a slot in reserve for sealing; the cache seals full groups, compacts layers that hold quantized
// blocks, and accounts the bytes each kind really takes.
//
// Entries hold small whole numbers that every group of 32 spans from 0 to 15 (keys per channel, values per entry),
// so int4 represents them exactly (scale 1, min 0): sealing must give them back exactly, and a compaction that
// rebuilds a key group must stay within half of its new scale (at most 1 here).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <numeric>
#include <set>
#include <stdexcept>
#include <vector>

#include <gtest/gtest.h>

#include "cache/block_pool.h"
#include "cache/kv_cache.h"
#include "kernels/backend.h"

namespace strata {
namespace {

KvBlockLayout quant_layout(KvQuant quant) {
  KvBlockLayout L;
  L.n_kv_heads = 2;
  L.head_dim = 32;
  L.block_size = 32;
  L.quant = quant;
  // full precision: 2 * 2 * 32 * 32 * 4 = 16,384 bytes. int4: codes 2 * 2 * 32 * 32 / 2 = 2,048 bytes, fp16 key
  // scales and mins 2 * 2 * 32 * 2 = 256, value ones 256: 2,560 bytes, 6 a slot. int8: 4,608 bytes, 3 a slot.
  return L;
}

constexpr int64_t kSlotBytes = 16384;
constexpr int64_t kInt4Bytes = 2560;
constexpr int kInt4PerSlot = 6;
// What n int4 blocks cost the pool: their share of the slots that pack them.
constexpr int64_t int4_pool_bytes(int64_t n) { return n * kSlotBytes / kInt4PerSlot; }

struct Fixture {
  std::unique_ptr<Backend> be = make_cpu_backend();
  BlockPool pool;
  KvCache cache;
  Fixture(KvQuant quant, int64_t n_slots, int n_layers) : pool(*be, quant_layout(quant), n_slots), cache(pool, 0, n_layers) {}
};

// ---------------------------------------------------------------------------------------------------------------
// Block pool

TEST(QuantizedBlockPool, SlotsReserveAndSlabs) {
  auto be = make_cpu_backend();
  BlockPool pool(*be, quant_layout(KvQuant::int4), 4);
  ASSERT_EQ(pool.layout().quantized_per_slot(), kInt4PerSlot);
  EXPECT_EQ(pool.layout().quantized_block_bytes(), kInt4Bytes);
  EXPECT_EQ(pool.n_total(), 3) << "one slot is the sealing reserve";
  EXPECT_EQ(pool.n_free(), 3);
  std::set<int32_t> first_slab;
  for (int i = 0; i < kInt4PerSlot; ++i) first_slab.insert(pool.allocate_quantized());
  EXPECT_EQ(first_slab.size(), size_t(kInt4PerSlot));
  EXPECT_EQ(pool.n_free(), 2) << "six int4 blocks take one slot";
  for (int32_t b : first_slab) {
    EXPECT_TRUE(pool.is_quantized(b));
    EXPECT_EQ(pool.slot_of(b), pool.slot_of(*first_slab.begin()));
  }
  EXPECT_EQ(pool.slab_used(pool.slot_of(*first_slab.begin())), kInt4PerSlot);
  const int32_t seventh = pool.allocate_quantized();
  EXPECT_NE(pool.slot_of(seventh), pool.slot_of(*first_slab.begin()));
  EXPECT_EQ(pool.n_free(), 1);
  // The fullest slab with room is used first: free one block of the first slab, and the next block goes there.
  pool.release(*first_slab.begin());
  const int32_t refill = pool.allocate_quantized();
  EXPECT_EQ(pool.slot_of(refill), pool.slot_of(*first_slab.begin()));
  // A slab gives its slot back when its last block goes.
  pool.release(seventh);
  EXPECT_EQ(pool.n_free(), 2);
  EXPECT_THROW(pool.release(seventh), std::logic_error);
  EXPECT_THROW(pool.release(int32_t(4 + 4 * kInt4PerSlot)), std::logic_error);  // past the last quantized id
}

TEST(QuantizedBlockPool, OnlyQuantizedBlocksMayTakeTheReserve) {
  auto be = make_cpu_backend();
  BlockPool pool(*be, quant_layout(KvQuant::int8), 2);
  const int32_t a = pool.allocate();
  EXPECT_EQ(pool.n_free(), 0);
  EXPECT_FALSE(pool.can_allocate(1));
  EXPECT_THROW(pool.allocate(), std::runtime_error);
  EXPECT_TRUE(pool.can_allocate_quantized());
  std::vector<int32_t> q;
  for (int i = 0; i < 3; ++i) q.push_back(pool.allocate_quantized());
  EXPECT_FALSE(pool.can_allocate_quantized());
  EXPECT_THROW(pool.allocate_quantized(), std::runtime_error);
  for (int32_t b : q) pool.release(b);
  pool.release(a);
  EXPECT_EQ(pool.n_free(), 1);
}

TEST(QuantizedBlockPool, ASharedQuantizedBlockKeepsItsSlab) {
  auto be = make_cpu_backend();
  BlockPool pool(*be, quant_layout(KvQuant::int8), 2);
  const int32_t q = pool.allocate_quantized();
  pool.share(q);
  pool.release(q);
  EXPECT_EQ(pool.slab_used(pool.slot_of(q)), 1);  // still held once
  pool.release(q);
  EXPECT_EQ(pool.slab_used(pool.slot_of(q)), 0);
  EXPECT_EQ(pool.n_free(), 1);  // both slots free, one of them the reserve
  EXPECT_THROW(pool.release(q), std::logic_error);
}

TEST(QuantizedBlockPool, FullPrecisionPoolsHaveNoQuantizedBlocksAndNoReserve) {
  auto be = make_cpu_backend();
  BlockPool pool(*be, quant_layout(KvQuant::none), 3);
  EXPECT_EQ(pool.n_total(), 3);
  EXPECT_FALSE(pool.can_allocate_quantized());
  EXPECT_THROW(pool.allocate_quantized(), std::logic_error);
  KvBlockLayout bad = quant_layout(KvQuant::int4);
  bad.block_size = 16;
  EXPECT_THROW(BlockPool(*be, bad, 4), std::invalid_argument);
  EXPECT_THROW(BlockPool(*be, quant_layout(KvQuant::int4), 1), std::invalid_argument) << "the reserve alone";
}

// ---------------------------------------------------------------------------------------------------------------
// KV cache

float key_tag(int entry, int head, int d) { return float((entry + head + d) % 16); }
float value_tag(int entry, int head, int d) { return float((3 * entry + head + d) % 16); }

// Writes the tags of entries [from, n_entries) of a layer, which must be full precision.
void write_tags(const KvCache& cache, SeqId seq, int layer, int from) {
  const KvPoolView view = cache.pool_view();
  const KvBlockLayout& L = view.layout;
  const LayerKv& kv = cache.layer(seq, layer);
  for (int e = from; e < kv.n_entries; ++e) {
    float* block = view.block_f32(kv.block_table[size_t(e / 32)]);
    for (int h = 0; h < L.n_kv_heads; ++h) {
      for (int d = 0; d < L.head_dim; ++d) {
        block[L.k_offset(h, e % 32) + d] = key_tag(e, h, d);
        block[L.v_offset(h, e % 32) + d] = value_tag(e, h, d);
      }
    }
  }
}

// Every entry of a layer as floats: quantized blocks through Backend::kv_dequantize into a spare block.
std::vector<std::vector<float>> read_layer(Fixture& f, SeqId seq, int layer) {
  const KvPoolView view = f.cache.pool_view();
  const KvBlockLayout& L = view.layout;
  const LayerKv& kv = f.cache.layer(seq, layer);
  std::vector<std::vector<float>> out;  // [entry][k (heads x dim), then v]
  const int32_t spare = f.pool.allocate(/*use_reserve=*/true);
  for (int e = 0; e < kv.n_entries; ++e) {
    int32_t block = kv.block_table[size_t(e / 32)];
    if (view.is_quantized(block)) {
      f.be->kv_dequantize(std::vector<int32_t>{block}, std::vector<int32_t>{spare}, view);
      block = spare;
    }
    std::vector<float> entry;
    for (int h = 0; h < L.n_kv_heads; ++h) {
      const float* k = view.block_f32(block) + L.k_offset(h, e % 32);
      entry.insert(entry.end(), k, k + L.head_dim);
    }
    for (int h = 0; h < L.n_kv_heads; ++h) {
      const float* v = view.block_f32(block) + L.v_offset(h, e % 32);
      entry.insert(entry.end(), v, v + L.head_dim);
    }
    out.push_back(std::move(entry));
  }
  f.pool.release(spare);
  return out;
}

// Entry j of the layer holds the tags of entry original[j]: values exactly, keys within key_tolerance.
void expect_tags(Fixture& f, SeqId seq, int layer, const std::vector<int32_t>& original, float key_tolerance) {
  const std::vector<std::vector<float>> entries = read_layer(f, seq, layer);
  ASSERT_EQ(entries.size(), original.size());
  for (size_t j = 0; j < original.size(); ++j) {
    for (int h = 0; h < 2; ++h) {
      for (int d = 0; d < 32; ++d) {
        ASSERT_NEAR(entries[j][size_t(h * 32 + d)], key_tag(original[j], h, d), key_tolerance) << "key of entry " << j;
        ASSERT_EQ(entries[j][size_t(64 + h * 32 + d)], value_tag(original[j], h, d)) << "value of entry " << j;
      }
    }
  }
}

std::vector<int32_t> iota_n(int n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

TEST(QuantizedKvCache, SealQuantizesFullGroupsAndAccountsTheirBytes) {
  Fixture f(KvQuant::int4, 20, 2);
  f.cache.append(1, 70);  // 3 full-precision blocks per layer, the last with 6 entries
  write_tags(f.cache, 1, 0, 0);
  write_tags(f.cache, 1, 1, 0);
  EXPECT_EQ(f.pool.n_free(), 19 - 6);
  EXPECT_EQ(f.cache.layer_usage(0).bytes, 3 * kSlotBytes);

  EXPECT_EQ(f.cache.seal(1, 0), 2);
  const LayerKv& kv = f.cache.layer(1, 0);
  EXPECT_EQ(kv.n_quantized_blocks, 2);
  ASSERT_EQ(kv.block_table.size(), 3u);
  EXPECT_TRUE(f.pool.is_quantized(kv.block_table[0]));
  EXPECT_TRUE(f.pool.is_quantized(kv.block_table[1]));
  EXPECT_FALSE(f.pool.is_quantized(kv.block_table[2]));
  EXPECT_EQ(kv.n_entries, 70);
  const LayerUsage u = f.cache.layer_usage(0);
  EXPECT_EQ(u.entries, 70);
  EXPECT_EQ(u.blocks, 3);
  EXPECT_EQ(u.quantized_blocks, 2);
  EXPECT_EQ(u.bytes, int4_pool_bytes(2) + kSlotBytes);
  EXPECT_EQ(u.full_precision_bytes, kSlotBytes) << "the unsealed block";
  EXPECT_EQ(u.uncompressed_bytes, 3 * kSlotBytes);
  EXPECT_EQ(f.cache.sequence_usage(1, 0).full_precision_bytes, kSlotBytes);
  // The peak was before sealing: every block of both layers at full precision.
  EXPECT_EQ(f.cache.peak(1).bytes, 6 * kSlotBytes);
  EXPECT_EQ(f.cache.peak(1).full_precision_bytes, 6 * kSlotBytes);
  EXPECT_EQ(f.pool.n_free(), 19 - 5) << "two full-precision blocks out, one slab in";
  expect_tags(f, 1, 0, iota_n(70), 0.0f);
  expect_tags(f, 1, 1, iota_n(70), 0.0f);
  EXPECT_EQ(f.cache.seal(1, 0), 0) << "6 entries do not make a group";

  // New entries go after the quantized blocks; a group that fills is sealed at the next call.
  EXPECT_EQ(f.cache.seal(1, 1), 2);
  EXPECT_EQ(f.cache.blocks_to_append(1, 26), 0);
  EXPECT_EQ(f.cache.blocks_to_append(1, 27), 2);
  f.cache.append(1, 26);
  write_tags(f.cache, 1, 0, 70);
  write_tags(f.cache, 1, 1, 70);
  EXPECT_EQ(f.cache.seal(1, 0), 1);
  EXPECT_EQ(f.cache.layer(1, 0).n_quantized_blocks, 3);
  EXPECT_EQ(f.cache.layer(1, 0).block_table.size(), 3u) << "the sealed block was the last one";
  EXPECT_EQ(f.cache.blocks_to_append(1, 1), 1 + 1) << "layer 0 has no full-precision block left, layer 1's is full";
  expect_tags(f, 1, 0, iota_n(96), 0.0f);

  EXPECT_EQ(f.cache.blocks_held(1), 1 + 1) << "layer 1's full-precision block and the one slab of both layers";
  const int64_t before = f.pool.n_free();
  f.cache.release(1);
  EXPECT_EQ(f.pool.n_free(), before + 2);
  EXPECT_EQ(f.pool.n_free(), f.pool.n_total());
  EXPECT_EQ(f.cache.layer_usage(0).bytes, 0);
  EXPECT_EQ(f.cache.layer_usage(0).uncompressed_bytes, 0);
}

TEST(QuantizedKvCache, RetainOnQuantizedLayersMovesValuesAndRebuildsKeyGroups) {
  Fixture f(KvQuant::int4, 20, 1);
  f.cache.append(7, 100);
  write_tags(f.cache, 7, 0, 0);
  ASSERT_EQ(f.cache.seal(7, 0), 3);
  const int64_t free_sealed = f.pool.n_free();

  // Two entries go: still 3 groups, 2 entries at full precision.
  std::vector<int32_t> kept;
  for (int e = 0; e < 100; ++e) {
    if (e != 5 && e != 50) kept.push_back(e);
  }
  f.cache.retain(7, 0, kept);
  EXPECT_EQ(f.cache.layer(7, 0).n_quantized_blocks, 3);
  EXPECT_EQ(f.cache.layer(7, 0).n_entries, 98);
  EXPECT_EQ(f.pool.n_free(), free_sealed);
  expect_tags(f, 7, 0, kept, 1.0f);  // rebuilt key groups: scale at most 15 / 15, error at most half

  // Down to 40 entries: one group stays quantized, 8 entries go to the full-precision block, 2 groups are freed.
  std::vector<int32_t> kept40;
  for (int j = 0; j < 40; ++j) kept40.push_back(kept[size_t(j * 2)]);
  f.cache.retain(7, 0, iota_n(98));  // keeping everything changes nothing
  f.cache.retain(7, 0, [&] {
    std::vector<int32_t> idx;
    for (int j = 0; j < 40; ++j) idx.push_back(j * 2);
    return idx;
  }());
  const LayerKv& kv = f.cache.layer(7, 0);
  EXPECT_EQ(kv.n_quantized_blocks, 1);
  EXPECT_EQ(kv.block_table.size(), 2u);
  EXPECT_EQ(kv.n_entries, 40);
  const LayerUsage u = f.cache.layer_usage(0);
  EXPECT_EQ(u.bytes, int4_pool_bytes(1) + kSlotBytes);
  EXPECT_EQ(u.uncompressed_bytes, 4 * kSlotBytes) << "what 100 entries take at full precision";
  expect_tags(f, 7, 0, kept40, 1.0f);
  f.cache.release(7);
  EXPECT_EQ(f.pool.n_free(), f.pool.n_total());
}

TEST(QuantizedKvCache, RetainPerHeadOnAQuantizedLayer) {
  Fixture f(KvQuant::int8, 12, 1);
  f.cache.append(3, 64);
  write_tags(f.cache, 3, 0, 0);
  ASSERT_EQ(f.cache.seal(3, 0), 2);
  f.cache.append(3, 1);  // a decode step's entry, as at every policy hook
  const std::vector<std::vector<float>> sealed = read_layer(f, 3, 0);
  std::vector<std::vector<int32_t>> kept = {iota_n(40), {}};
  for (int e = 25; e < 65; ++e) kept[1].push_back(e);
  f.cache.retain(3, 0, kept);
  EXPECT_EQ(f.cache.layer(3, 0).n_quantized_blocks, 1);
  EXPECT_EQ(f.cache.layer(3, 0).n_entries, 40);
  const std::vector<std::vector<float>> entries = read_layer(f, 3, 0);
  for (int j = 0; j < 40; ++j) {
    for (int h = 0; h < 2; ++h) {
      const int original = kept[size_t(h)][size_t(j)];
      if (original == 64) continue;  // never written
      for (int d = 0; d < 32; ++d) {
        // int8 on a 0..15 grid: scale 15 / 255, so rebuilt keys stay within 0.03. Values move as they were
        // sealed, codes and scales, without a second rounding.
        ASSERT_NEAR(entries[size_t(j)][size_t(h * 32 + d)], key_tag(original, h, d), 0.03f) << j;
        ASSERT_NEAR(entries[size_t(j)][size_t(64 + h * 32 + d)], value_tag(original, h, d), 0.03f) << j;
        ASSERT_EQ(entries[size_t(j)][size_t(64 + h * 32 + d)], sealed[size_t(original)][size_t(64 + h * 32 + d)]);
      }
    }
  }
}

TEST(QuantizedKvCache, SealingWaitsWhenThePoolHasNoRoomAndNeverThrows) {
  Fixture f(KvQuant::int8, 3, 1);  // 2 slots for appends, 1 in reserve
  f.cache.append(1, 64);
  EXPECT_EQ(f.pool.n_free(), 0);
  std::vector<int32_t> taken;  // someone else fills the reserve with a slab of quantized blocks
  for (int i = 0; i < 3; ++i) taken.push_back(f.pool.allocate_quantized());
  EXPECT_EQ(f.cache.seal(1, 0), 0);
  EXPECT_EQ(f.cache.layer(1, 0).n_quantized_blocks, 0);
  for (int32_t b : taken) f.pool.release(b);
  // With the reserve back, both groups are sealed: one slab for both, both full-precision blocks given back.
  EXPECT_EQ(f.cache.seal(1, 0), 2);
  EXPECT_EQ(f.pool.n_free(), 1);
}

TEST(QuantizedKvCache, BlocksHeldCountsOnlySlabsASequenceHoldsAlone) {
  Fixture f(KvQuant::int4, 10, 1);
  f.cache.append(1, 32);
  f.cache.append(2, 32);
  ASSERT_EQ(f.cache.seal(1, 0), 1);
  ASSERT_EQ(f.cache.seal(2, 0), 1);
  ASSERT_EQ(f.pool.slot_of(f.cache.layer(1, 0).block_table[0]), f.pool.slot_of(f.cache.layer(2, 0).block_table[0]));
  EXPECT_EQ(f.cache.blocks_held(1), 0) << "the slab is shared: releasing 1 frees no slot";
  const int64_t before = f.pool.n_free();
  f.cache.release(1);
  EXPECT_EQ(f.pool.n_free(), before);
  EXPECT_EQ(f.cache.blocks_held(2), 1);
  f.cache.release(2);
  EXPECT_EQ(f.pool.n_free(), before + 1);
}

// [shared-compressed]: a compressed prefix of sealed groups stays cached after its sequence, and a new sequence
// shares it as it is: it reads the same entries, holds no slot of its own for them (their slabs stay while the
// cache holds them), appends after them at full precision, and every slot comes back once all let go.
TEST(QuantizedKvCache, ACompressedPrefixOfSealedGroupsIsShared) {
  Fixture f(KvQuant::int4, 20, 2);
  const int64_t all_free = f.pool.n_free();
  f.cache.append(1, 70);
  for (int l = 0; l < 2; ++l) write_tags(f.cache, 1, l, 0);
  std::vector<int32_t> kept;  // 64 of the 70 entries: two whole groups
  for (int e = 0; e < 70; ++e) {
    if (e != 4 && e != 32 && (e < 36 || e > 39)) kept.push_back(e);
  }
  for (int l = 0; l < 2; ++l) {
    f.cache.retain(1, l, kept);
    ASSERT_EQ(f.cache.seal(1, l), 2);
  }
  f.cache.publish_compressed(1, 0, 101);
  f.cache.publish_compressed(1, 1, 102);
  f.cache.release(1);
  const std::vector<uint64_t> chain = {101, 102};
  EXPECT_EQ(f.cache.n_cached_blocks(), 2);

  f.cache.start_from_prefix(2, chain, /*copy=*/false, /*position=*/70);
  for (int l = 0; l < 2; ++l) {
    const LayerKv& kv = f.cache.layer(2, l);
    EXPECT_EQ(kv.n_quantized_blocks, 2);
    EXPECT_EQ(kv.n_entries, 64);
    EXPECT_EQ(kv.n_appended, 70);
    expect_tags(f, 2, l, kept, 1.0f);
    EXPECT_EQ(f.cache.layer_usage(l).quantized_blocks, 2);
    EXPECT_EQ(f.cache.layer_usage(l).blocks, 2);
  }
  EXPECT_EQ(f.cache.blocks_held(2), 0) << "the cache holds the slab too";
  EXPECT_EQ(f.cache.blocks_to_append(2, 1), 2) << "a full-precision block per layer after the sealed groups";
  f.cache.append(2, 1);
  EXPECT_EQ(f.cache.layer(2, 0).n_entries, 65);
  EXPECT_EQ(f.cache.blocks_held(2), 2);
  EXPECT_THROW(f.cache.retain(2, 0, iota_n(40)), std::logic_error) << "a shared sealed group is never rewritten";

  f.cache.release(2);
  EXPECT_EQ(f.cache.layer_usage(0).quantized_blocks, 0);
  f.cache.evict(chain);
  EXPECT_EQ(f.pool.n_free(), all_free);
}

TEST(QuantizedKvCache, FullPrecisionPoolsNeverSeal) {
  auto be = make_cpu_backend();
  KvBlockLayout L = quant_layout(KvQuant::none);
  BlockPool pool(*be, L, 8);
  KvCache cache(pool, 0, 1);
  cache.append(1, 64);
  EXPECT_EQ(cache.seal(1, 0), 0);
  EXPECT_EQ(cache.layer(1, 0).n_quantized_blocks, 0);
  EXPECT_EQ(cache.layer_usage(0).bytes, 2 * kSlotBytes);
}

}  // namespace
}  // namespace strata
