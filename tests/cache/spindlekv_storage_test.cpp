// SpindleKV's storage in the KV cache (KvCache::replace_with_codebook, code_appended): coded blocks, codebook
// pages and the partial group's open block in pool memory, the accounting of their bytes, decode-time matching
// against the codebook, and every block back in the pool at release. Hand-computed on 2-D directions.
#include <cmath>
#include <memory>
#include <numbers>
#include <vector>

#include <gtest/gtest.h>

#include "cache/block_pool.h"
#include "cache/kv_cache.h"
#include "cache/storage_observations.h"
#include "kernels/backend.h"

namespace strata {
namespace {

constexpr double kDeg = std::numbers::pi / 180.0;

// One KV head, head dim 4, 4 entries a block: a slot is 128 bytes, a coded block 4 * 20 = 80 (one a slot), a
// codebook page 8 vectors.
KvBlockLayout layout() { return KvBlockLayout{1, 4, 4, DType::f32}; }

struct Fixture {
  std::unique_ptr<Backend> be = make_cpu_backend();
  BlockPool pool{*be, layout(), 16};
  KvCache cache{pool, 0, 1};
  RopeParams rope{RopeStyle::interleaved, 10000.0f, {}};
  Fixture() { cache.set_key_rope(rope, 64); }

  // Writes entry e: key = RoPE(length * (cos a, sin a, 0, 0), position), value = length * (1, 1, 0, 0) / sqrt 2.
  void write(int entry, double length, double degrees, int32_t position) {
    const LayerKv& kv = cache.layer(1, 0);
    const KvPoolView view = cache.pool_view();
    float* block = view.block_f32(kv.block_table.at(size_t(entry / 4)));
    std::vector<float> k = {float(length * std::cos(degrees * kDeg)), float(length * std::sin(degrees * kDeg)), 0, 0};
    Tensor t{k.data(), DType::f32, 1, 4};
    be->rope(t, std::span<const int32_t>(&position, 1), 1, 4, rope);
    std::copy(k.begin(), k.end(), block + view.layout.k_offset(0, entry % 4));
    float* v = block + view.layout.v_offset(0, entry % 4);
    v[0] = v[1] = float(length / std::sqrt(2.0));
    v[2] = v[3] = 0.0f;
  }
};

// Six prompt entries with key directions 0 10 20 30 90 95 degrees: theta_K 0.98 (11.5 deg) gives the greedy
// codebook {10: 0 10 20}, {90: 90 95}, {30}: 3 key vectors; the values share one direction: 1 vector.
TEST(SpindleKvStorage, ReplaceDecodeAndRelease) {
  Fixture f;
  f.cache.append(1, 6);
  const double angles[] = {0, 10, 20, 30, 90, 95};
  for (int e = 0; e < 6; ++e) f.write(e, 1.0 + e, angles[e], e);
  ASSERT_TRUE(f.cache.replace_with_codebook(1, 0, std::vector<std::vector<int32_t>>{{0, 1, 2, 3, 4, 5}}, 0.98f, 0.95f));

  const LayerKv& kv = f.cache.layer(1, 0);
  ASSERT_TRUE(kv.codebook);
  EXPECT_EQ(kv.codebook->keys[0].size(), 3u);
  EXPECT_EQ(kv.codebook->values[0].size(), 1u);
  EXPECT_EQ(kv.n_coded_blocks, 1);                        // entries 0-3
  ASSERT_EQ(kv.block_table.size(), 2u);
  EXPECT_TRUE(f.cache.pool_view().is_coded(kv.block_table[0]));
  EXPECT_FALSE(f.cache.pool_view().is_coded(kv.block_table[1]));  // entries 4-5: reconstructions, codes in the open block
  EXPECT_GE(kv.codebook->open_block, 0);
  // Memory: one full-precision block, two coded blocks (one open), one page of codebook vectors. A coded block
  // takes 80 bytes, so a 128-byte slot packs one and each costs the pool the whole slot.
  LayerUsage u = f.cache.layer_usage(0);
  EXPECT_EQ(u.coded_blocks, 2);
  EXPECT_EQ(u.codebook_pages, 1);
  EXPECT_EQ(u.codebook_vectors, 4);
  std::vector<Observation> layer_observed, sequence_observed;  // as the reports carry them
  observe_layer_storage(u, layer_observed);
  observe_sequence_storage(f.cache, 1, 0, sequence_observed);
  EXPECT_EQ(layer_observed, (std::vector<Observation>{{"codebook_vectors", 4}}));
  EXPECT_EQ(sequence_observed, (std::vector<Observation>{{"codebook.keys", 3}, {"codebook.values", 1}}));
  EXPECT_EQ(u.bytes, 128 + 2 * 128 + 128);
  EXPECT_EQ(f.cache.sequence_usage(1, 0).bytes, u.bytes);
  EXPECT_EQ(f.pool.n_free(), 16 - 4);                     // 1 block, 1 page, 2 slabs
  EXPECT_EQ(f.cache.blocks_held(1), 4);

  // Entry 5 (95 deg, length 6) is held as its reconstruction: RoPE(6 * (cos 90, sin 90), 5).
  {
    std::vector<float> expected = {0.0f, 6.0f, 0.0f, 0.0f};
    Tensor t{expected.data(), DType::f32, 1, 4};
    const int32_t position = 5;
    f.be->rope(t, std::span<const int32_t>(&position, 1), 1, 4, f.rope);
    const float* key = f.cache.pool_view().block_f32(kv.block_table[1]) + layout().k_offset(0, 1);
    for (int d = 0; d < 4; ++d) EXPECT_NEAR(key[d], expected[size_t(d)], 1e-5);
  }

  // Decode: a key at 3 deg (cos 7 deg = 0.9925 > 0.98 with the 10 deg entry) joins it; one at 60 deg (cos 30 deg
  // with both 30 and 90) is a new entry. Entry 7 fills the second group, whose open block replaces its block.
  f.cache.append(1, 1);
  f.write(6, 2.0, 3, 6);
  f.cache.code_appended(1, 0, 6);
  EXPECT_EQ(kv.codebook->keys[0].size(), 3u);
  EXPECT_EQ(kv.codebook->values[0].size(), 1u);
  f.cache.append(1, 1);
  f.write(7, 2.0, 60, 7);
  f.cache.code_appended(1, 0, 7);
  EXPECT_EQ(kv.codebook->keys[0].size(), 4u);
  EXPECT_EQ(kv.n_coded_blocks, 2);
  EXPECT_EQ(kv.codebook->open_block, -1);
  EXPECT_EQ(kv.block_table.size(), 2u);
  u = f.cache.layer_usage(0);
  EXPECT_EQ(u.codebook_vectors, 5);
  EXPECT_EQ(u.bytes, 2 * 128 + 128);
  const KvCodeRow* rows = f.cache.pool_view().block_coded(kv.block_table[1]);
  EXPECT_EQ(rows[2].k_vector, kv.codebook->keys[0][0]);
  EXPECT_EQ(rows[3].k_vector, kv.codebook->keys[0][3]);
  EXPECT_EQ(rows[3].position, 7);
  EXPECT_NEAR(rows[2].k_magnitude, 2.0f, 1e-5);

  // A codebook layer is never compacted; releasing gives every slot back.
  EXPECT_THROW(f.cache.retain(1, 0, std::vector<int32_t>{0, 1}), std::logic_error);
  f.cache.release(1);
  EXPECT_EQ(f.pool.n_free(), 16);
  EXPECT_EQ(f.cache.layer_usage(0).bytes, 0);
  EXPECT_EQ(f.cache.layer_usage(0).codebook_vectors, 0);
}

TEST(SpindleKvStorage, QuantizedPoolsAreRejected) {
  auto be = make_cpu_backend();
  KvBlockLayout L{1, 32, 32, DType::f32, KvQuant::int8};
  BlockPool pool(*be, L, 8);
  KvCache cache(pool, 0, 1);
  cache.append(1, 2);
  EXPECT_THROW(cache.replace_with_codebook(1, 0, std::vector<std::vector<int32_t>>{{0, 1}}, 0.98f, 0.95f),
               std::invalid_argument);
}

}  // namespace
}  // namespace strata
