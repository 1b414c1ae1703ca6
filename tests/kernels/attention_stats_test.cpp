// The attention statistics compression policies ask for (column sums of softmax probabilities over chosen query
// rows), and compaction of one KV head, against naive references.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/backend.h"

namespace strata {
namespace {

constexpr int kHeads = 6, kKvHeads = 2, kHeadDim = 8, kBlock = 4;

struct Fixture {
  std::unique_ptr<Backend> backend = make_cpu_backend();
  KvBlockLayout layout{kKvHeads, kHeadDim, kBlock, DType::f32};
  Tensor storage;
  KvPoolView pool;
  std::vector<int32_t> table;  // shuffled blocks

  explicit Fixture(int n_entries, std::mt19937& rng) {
    const int n_blocks = (n_entries + kBlock - 1) / kBlock + 3;
    storage = backend->alloc(n_blocks, layout.elements_per_block(), DType::f32);
    pool = KvPoolView{storage.data, layout, 0, {}};
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int64_t i = 0; i < storage.size(); ++i) storage.f32()[i] = normal(rng);
    table.resize(size_t((n_entries + kBlock - 1) / kBlock));
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), rng);
    for (int32_t& b : table) b += 1;  // leave block 0 unused
  }
  ~Fixture() { backend->free(storage); }
  const float* key(int head, int entry) const {
    return pool.block_f32(table[size_t(entry / kBlock)]) + layout.k_offset(head, entry % kBlock);
  }
};

TEST(AttentionStats, ColumnSumsEqualNaiveProbabilitiesOfTheChosenRows) {
  std::mt19937 rng(11);
  const int n_before = 9, n_q = 7, n_entries = n_before + n_q, row_begin = 3;
  Fixture f(n_entries, rng);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> q(size_t(n_q) * kHeads * kHeadDim), out(q.size());
  for (float& x : q) x = normal(rng);
  std::vector<float> sums(size_t(kHeads) * 20, 0.0f);
  AttentionSequence s{0, n_q, n_before, f.table, sums.data(), 20, row_begin};
  const float scale = 1.0f / std::sqrt(float(kHeadDim));
  Tensor qt{q.data(), DType::f32, n_q, kHeads * kHeadDim}, ot{out.data(), DType::f32, n_q, kHeads * kHeadDim};
  f.backend->paged_attention(qt, {&s, 1}, f.pool, kHeads, scale, ot);

  for (int h = 0; h < kHeads; ++h) {
    std::vector<double> expected(20, 0.0);
    for (int i = row_begin; i < n_q; ++i) {
      const int n_keys = n_before + i + 1;
      std::vector<double> logits(static_cast<size_t>(n_keys), 0.0);
      double max_logit = -1e300;
      for (int e = 0; e < n_keys; ++e) {
        double dot = 0;
        for (int d = 0; d < kHeadDim; ++d) dot += double(q[size_t((i * kHeads + h) * kHeadDim + d)]) * f.key(h / 3, e)[d];
        logits[size_t(e)] = dot * scale;
        max_logit = std::max(max_logit, logits[size_t(e)]);
      }
      double total = 0;
      for (double& l : logits) total += (l = std::exp(l - max_logit));
      for (int e = 0; e < n_keys; ++e) expected[size_t(e)] += logits[size_t(e)] / total;
    }
    double row_mass = 0;
    for (int e = 0; e < 20; ++e) {
      EXPECT_NEAR(sums[size_t(h * 20 + e)], expected[size_t(e)], 1e-5) << "head " << h << " entry " << e;
      row_mass += sums[size_t(h * 20 + e)];
    }
    EXPECT_NEAR(row_mass, n_q - row_begin, 1e-4) << "each summed row is a distribution";
  }
}

TEST(AttentionStats, NoSumsRequestedLeavesOutputUnchanged) {
  std::mt19937 rng(5);
  Fixture f(12, rng);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> q(size_t(4) * kHeads * kHeadDim), a(q.size()), b(q.size()), sums(size_t(kHeads) * 12);
  for (float& x : q) x = normal(rng);
  Tensor qt{q.data(), DType::f32, 4, kHeads * kHeadDim};
  Tensor at{a.data(), DType::f32, 4, kHeads * kHeadDim}, bt{b.data(), DType::f32, 4, kHeads * kHeadDim};
  AttentionSequence plain{0, 4, 8, f.table};
  AttentionSequence with{0, 4, 8, f.table, sums.data(), 12, 0};
  f.backend->paged_attention(qt, {&plain, 1}, f.pool, kHeads, 0.3f, at);
  f.backend->paged_attention(qt, {&with, 1}, f.pool, kHeads, 0.3f, bt);
  EXPECT_EQ(a, b) << "computing statistics must not change the attention output";
}

TEST(KvCompactOneHead, MovesOnlyThatHead) {
  std::mt19937 rng(3);
  const int n = 10;
  Fixture f(n, rng);
  std::vector<std::vector<float>> before(kKvHeads);
  for (int h = 0; h < kKvHeads; ++h) {
    for (int e = 0; e < n; ++e) before[size_t(h)].insert(before[size_t(h)].end(), f.key(h, e), f.key(h, e) + kHeadDim);
  }
  const std::vector<int32_t> kept = {1, 4, 9};
  f.backend->kv_compact(f.table, kept, f.pool, 1);
  for (int e = 0; e < n; ++e) {
    for (int d = 0; d < kHeadDim; ++d) {
      EXPECT_EQ(f.key(0, e)[d], before[0][size_t(e * kHeadDim + d)]) << "head 0 is untouched";
    }
  }
  for (size_t j = 0; j < kept.size(); ++j) {
    for (int d = 0; d < kHeadDim; ++d) EXPECT_EQ(f.key(1, int(j))[d], before[1][size_t(kept[j] * kHeadDim + d)]);
  }
}

}  // namespace
}  // namespace strata
