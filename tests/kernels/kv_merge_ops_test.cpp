// D2O's cache ops on the CPU backend (kernels/cpu/kv_merge_ops.cpp) against hand-computed values: the cosine
// nearest key and the weighted merge, on a two-block, two-head pool with a shuffled block table.
#include <cmath>
#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/backend.h"

namespace strata {
namespace {

// 2 KV heads, head dim 3, 2 entries per block, 3 blocks in memory; the layer's table is {2, 0}, so entries 0-1
// live in block 2 and entries 2-3 in block 0.
struct SmallPool {
  KvBlockLayout layout{2, 3, 2, DType::f32};
  std::vector<float> memory = std::vector<float>(size_t(3 * layout.elements_per_block()), 0.0f);
  std::vector<int32_t> table = {2, 0};
  KvPoolView view() { return KvPoolView{memory.data(), layout, 0, {}}; }

  float* key(int head, int entry) {
    return view().block_f32(table[size_t(entry / 2)]) + layout.k_offset(head, entry % 2);
  }
  float* value(int head, int entry) {
    return view().block_f32(table[size_t(entry / 2)]) + layout.v_offset(head, entry % 2);
  }
  void set(int head, int entry, std::vector<float> k, std::vector<float> v) {
    std::copy(k.begin(), k.end(), key(head, entry));
    std::copy(v.begin(), v.end(), value(head, entry));
  }
};

TEST(KvNearestKeys, CosineOfTheBestCandidateAndWhichOne) {
  SmallPool pool;
  // Head 1 only; head 0 holds other keys that must not be read.
  pool.set(1, 0, {1, 0, 0}, {0, 0, 0});
  pool.set(1, 1, {3, 4, 0}, {0, 0, 0});   // |k| = 5
  pool.set(1, 2, {0, 0, 2}, {0, 0, 0});
  pool.set(1, 3, {1, 1, 0}, {0, 0, 0});   // |k| = sqrt 2
  pool.set(0, 0, {1, 1, 0}, {0, 0, 0});
  auto backend = make_cpu_backend();
  const std::vector<int32_t> queries = {1, 3};
  const std::vector<int32_t> candidates = {0, 2};
  std::vector<float> similarity(2);
  std::vector<int32_t> nearest(2);
  backend->kv_nearest_keys(pool.table, 1, queries, candidates, pool.view(), similarity, nearest);
  // entry 1 (3,4,0)/5: cos with (1,0,0) = 0.6, with (0,0,1) = 0.
  EXPECT_NEAR(similarity[0], 0.6f, 1e-6);
  EXPECT_EQ(nearest[0], 0);
  // entry 3 (1,1,0)/sqrt2: cos with entry 0 = 1/sqrt2.
  EXPECT_NEAR(similarity[1], 1.0 / std::sqrt(2.0), 1e-6);
  EXPECT_EQ(nearest[1], 0);

  // Against entries 2 and 3 (in that order): entry 1 gets 0.6 * 1/sqrt2 + 0.8 * 1/sqrt2 = 1.4/sqrt2 from entry 3.
  const std::vector<int32_t> other = {2, 3};
  backend->kv_nearest_keys(pool.table, 1, std::vector<int32_t>{1}, other, pool.view(),
                           std::span<float>(similarity).first(1), std::span<int32_t>(nearest).first(1));
  EXPECT_NEAR(similarity[0], 1.4 / std::sqrt(2.0), 1e-6);
  EXPECT_EQ(nearest[0], 1);
}

TEST(KvNearestKeys, TiesGoToTheLowerCandidateAndZeroKeysScoreZero) {
  SmallPool pool;
  pool.set(0, 0, {0, 1, 0}, {0, 0, 0});
  pool.set(0, 1, {0, 2, 0}, {0, 0, 0});  // the same direction as entry 0
  pool.set(0, 2, {0, 5, 0}, {0, 0, 0});
  // entry 3 stays all zeros: its norm is clamped, its cosine with anything is 0, not NaN.
  auto backend = make_cpu_backend();
  std::vector<float> similarity(2);
  std::vector<int32_t> nearest(2);
  backend->kv_nearest_keys(pool.table, 0, std::vector<int32_t>{2, 3}, std::vector<int32_t>{1, 0}, pool.view(),
                           similarity, nearest);
  EXPECT_NEAR(similarity[0], 1.0f, 1e-6);
  EXPECT_EQ(nearest[0], 0);  // candidates 1 and 0 tie at 1: the first listed wins
  EXPECT_EQ(similarity[1], 0.0f);
  EXPECT_EQ(nearest[1], 0);
}

TEST(KvMerge, WeightedSumIntoTheTargetKeysAndValues) {
  SmallPool pool;
  pool.set(0, 0, {1, 2, 3}, {10, 20, 30});
  pool.set(0, 1, {4, 0, 0}, {0, 40, 0});
  pool.set(0, 2, {0, 0, 8}, {0, 0, 80});
  pool.set(0, 3, {2, 2, 2}, {1, 1, 1});
  pool.set(1, 0, {7, 7, 7}, {7, 7, 7});  // the other head: untouched
  KvMerges merges;
  merges.add(0, 0.5f, {1, 2}, {0.25f, 0.125f});  // entry 0 <- 0.5 e0 + 0.25 e1 + 0.125 e2
  merges.add(3, 1.0f, {1}, {-1.0f});             // entry 3 <- e3 - e1
  auto backend = make_cpu_backend();
  backend->kv_merge(pool.table, merges, pool.view(), 0);
  EXPECT_EQ(std::vector<float>(pool.key(0, 0), pool.key(0, 0) + 3), (std::vector<float>{1.5f, 1.0f, 2.5f}));
  EXPECT_EQ(std::vector<float>(pool.value(0, 0), pool.value(0, 0) + 3), (std::vector<float>{5, 20, 25}));
  EXPECT_EQ(std::vector<float>(pool.key(0, 3), pool.key(0, 3) + 3), (std::vector<float>{-2, 2, 2}));
  EXPECT_EQ(std::vector<float>(pool.value(0, 3), pool.value(0, 3) + 3), (std::vector<float>{1, -39, 1}));
  // Sources are read, not changed; the other head is not touched.
  EXPECT_EQ(std::vector<float>(pool.key(0, 1), pool.key(0, 1) + 3), (std::vector<float>{4, 0, 0}));
  EXPECT_EQ(std::vector<float>(pool.key(1, 0), pool.key(1, 0) + 3), (std::vector<float>{7, 7, 7}));
}

TEST(KvMerge, RejectsInconsistentArraysAndBadHeads) {
  SmallPool pool;
  auto backend = make_cpu_backend();
  KvMerges merges;
  merges.add(0, 1.0f, {1}, {1.0f});
  EXPECT_THROW(backend->kv_merge(pool.table, merges, pool.view(), 2), std::invalid_argument);
  merges.source_weights.pop_back();
  EXPECT_THROW(backend->kv_merge(pool.table, merges, pool.view(), 0), std::invalid_argument);
}

TEST(KvMerge, RefusesQuantizedBlocks) {
  // An int8 pool of 3 full-precision slots: block id 3 is quantized block 0. Neither op touches such a layer.
  SmallPool pool;
  KvPoolView view = pool.view();
  view.layout.quant = KvQuant::int8;
  view.n_slots = 3;
  const std::vector<int32_t> table = {0, 3};
  KvMerges merges;
  merges.add(0, 1.0f, {1}, {1.0f});
  auto backend = make_cpu_backend();
  EXPECT_THROW(backend->kv_merge(table, merges, view, 0), std::invalid_argument);
  std::vector<float> similarity(1);
  std::vector<int32_t> nearest(1);
  EXPECT_THROW(backend->kv_nearest_keys(table, 0, std::vector<int32_t>{1}, std::vector<int32_t>{0}, view,
                                        similarity, nearest),
               std::invalid_argument);
}

}  // namespace
}  // namespace strata
