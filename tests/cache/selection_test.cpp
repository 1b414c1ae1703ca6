#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <vector>

#include <gtest/gtest.h>

#include "cache/policies/selection.h"

namespace strata {
namespace {

using Ids = std::vector<int32_t>;

// ---- reduce_to_kv_heads ----

TEST(ReduceToKvHeads, MeanAndMaxOverEachGroupOnly) {
  // 4 query heads, 2 KV heads (heads 0,1 -> KV 0; heads 2,3 -> KV 1); stride 4 > n_cols 3: the padding is ignored.
  const std::vector<float> sums = {
      1, 4, 0, 99,  //
      3, 0, 2, 99,  //
      5, 5, 1, 99,  //
      1, 7, 1, 99,  //
  };
  const auto mean = reduce_to_kv_heads(sums.data(), 4, 4, 2, 3, HeadReduction::mean);
  ASSERT_EQ(mean.size(), 2u);
  EXPECT_EQ(mean[0], (std::vector<float>{2, 2, 1}));
  EXPECT_EQ(mean[1], (std::vector<float>{3, 6, 1}));
  const auto max = reduce_to_kv_heads(sums.data(), 4, 4, 2, 3, HeadReduction::max);
  EXPECT_EQ(max[0], (std::vector<float>{3, 4, 2}));
  EXPECT_EQ(max[1], (std::vector<float>{5, 7, 1}));
}

TEST(ReduceToKvHeads, OneHeadPerGroupIsTheIdentityAndMqaReducesAll) {
  const std::vector<float> sums = {1, 2, 3, 4, 5, 6};
  const auto same = reduce_to_kv_heads(sums.data(), 2, 3, 3, 2, HeadReduction::mean);
  EXPECT_EQ(same, (std::vector<std::vector<float>>{{1, 2}, {3, 4}, {5, 6}}));
  const auto mqa = reduce_to_kv_heads(sums.data(), 2, 3, 1, 2, HeadReduction::mean);
  EXPECT_EQ(mqa, (std::vector<std::vector<float>>{{3, 4}}));
}

TEST(ReduceToKvHeads, RejectsGroupsThatDoNotDivide) {
  const std::vector<float> sums(12, 0.0f);
  EXPECT_THROW(reduce_to_kv_heads(sums.data(), 2, 6, 4, 2, HeadReduction::mean), std::invalid_argument);
  EXPECT_THROW(reduce_to_kv_heads(sums.data(), 2, 2, 0, 2, HeadReduction::mean), std::invalid_argument);
  EXPECT_THROW(reduce_to_kv_heads(sums.data(), 2, 2, 4, 2, HeadReduction::mean), std::invalid_argument);
}

// ---- pool1d ----

TEST(Pool1d, MaxAtTheEdgesIgnoresThePadding) {
  EXPECT_EQ(pool1d(std::vector<float>{5, 1, 0, 0, 3, 0}, 3, Pooling::max), (std::vector<float>{5, 5, 1, 3, 3, 3}));
  // All negative: a zero pad would win at both edges if it took part.
  EXPECT_EQ(pool1d(std::vector<float>{-1, -2, -3}, 3, Pooling::max), (std::vector<float>{-1, -1, -2}));
  EXPECT_EQ(pool1d(std::vector<float>{-4, -2, -3, -5}, 5, Pooling::max), (std::vector<float>{-2, -2, -2, -2}));
}

TEST(Pool1d, AvgDividesByTheKernelEvenAtTheEdges) {
  EXPECT_EQ(pool1d(std::vector<float>{3, 6, 9, 12}, 3, Pooling::avg), (std::vector<float>{3, 6, 9, 7}));
  const std::vector<float> k5 = pool1d(std::vector<float>{3, 6, 9, 12}, 5, Pooling::avg);
  ASSERT_EQ(k5.size(), 4u);
  EXPECT_FLOAT_EQ(k5[0], 18.0f / 5);  // (0 + 0 + 3 + 6 + 9) / 5
  EXPECT_FLOAT_EQ(k5[1], 30.0f / 5);
  EXPECT_FLOAT_EQ(k5[2], 30.0f / 5);
  EXPECT_FLOAT_EQ(k5[3], 27.0f / 5);
}

TEST(Pool1d, KernelWiderThanTheInputClipsEveryWindow) {
  const std::vector<float> avg = pool1d(std::vector<float>{1, 2}, 7, Pooling::avg);
  ASSERT_EQ(avg.size(), 2u);
  EXPECT_FLOAT_EQ(avg[0], 3.0f / 7);
  EXPECT_FLOAT_EQ(avg[1], 3.0f / 7);
  EXPECT_EQ(pool1d(std::vector<float>{1, 2}, 7, Pooling::max), (std::vector<float>{2, 2}));
  EXPECT_TRUE(pool1d(std::vector<float>{}, 5, Pooling::max).empty());
}

TEST(Pool1d, KernelOneAndNoneAreTheIdentity) {
  const std::vector<float> x = {0.5f, 2, 1};
  EXPECT_EQ(pool1d(x, 1, Pooling::max), x);
  EXPECT_EQ(pool1d(x, 1, Pooling::avg), x);
  EXPECT_EQ(pool1d(x, 7, Pooling::none), x);
}

TEST(Pool1d, RejectsEvenOrNonPositiveKernels) {
  const std::vector<float> x = {1, 2, 3};
  EXPECT_THROW(pool1d(x, 4, Pooling::max), std::invalid_argument);
  EXPECT_THROW(pool1d(x, 0, Pooling::avg), std::invalid_argument);
  EXPECT_THROW(pool1d(x, -3, Pooling::avg), std::invalid_argument);
}

// ---- top_k ----

TEST(TopK, HigherScoreFirstThenLowerIndexReturnedAscending) {
  const std::vector<float> s = {1, 3, 3, 2, 3};
  EXPECT_EQ(top_k(s, 0), Ids{});
  EXPECT_EQ(top_k(s, 1), (Ids{1}));
  EXPECT_EQ(top_k(s, 2), (Ids{1, 2}));
  EXPECT_EQ(top_k(s, 3), (Ids{1, 2, 4}));
  EXPECT_EQ(top_k(s, 4), (Ids{1, 2, 3, 4}));
  EXPECT_EQ(top_k(s, 5), (Ids{0, 1, 2, 3, 4}));
}

TEST(TopK, AMaxPoolPlateauIsCutAtTheLowerIndices) {
  // A peak at 4 pooled with k = 3 makes the plateau 3..5; two of its three cells fit: 3 and 4.
  const std::vector<float> pooled = pool1d(std::vector<float>{0, 0, 0, 0, 9, 0, 0}, 3, Pooling::max);
  EXPECT_EQ(pooled, (std::vector<float>{0, 0, 0, 9, 9, 9, 0}));
  EXPECT_EQ(top_k(pooled, 2), (Ids{3, 4}));
  EXPECT_EQ(top_k(pooled, 4), (Ids{0, 3, 4, 5}));
}

TEST(TopK, NanRanksBelowEverything) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(top_k(std::vector<float>{nan, -1, 0, nan}, 2), (Ids{1, 2}));
  EXPECT_EQ(top_k(std::vector<float>{nan, -1, 0, nan}, 3), (Ids{0, 1, 2}));
}

TEST(TopK, RejectsKOutsideTheScores) {
  const std::vector<float> s = {1, 2};
  EXPECT_THROW(top_k(s, 3), std::invalid_argument);
  EXPECT_THROW(top_k(s, -1), std::invalid_argument);
}

// ---- select_top_plus_window ----

TEST(SelectTopPlusWindow, PerKvHeadTopOfPooledScoresThenTheWindow) {
  // 2 query heads, 2 KV heads, 7 entries, window 2: keys 0..4 are scored. Columns 5 and 6 are the window's and
  // never count, even when large.
  const std::vector<float> sums = {
      0, 1, 0, 0, 4, 50, 50,  // head 0: max-pooled k=3 -> 1 1 1 4 4: top-2 = 3, 4
      6, 0, 0, 2, 0, 50, 50,  // head 1: max-pooled k=3 -> 6 6 2 2 2: top-2 = 0, 1
  };
  LayerState state;
  state.prompt_len = 7;
  state.n_entries = 7;
  state.column_sums = sums.data();
  state.sums_stride = 7;
  const Selection sel = select_top_plus_window(state, 2, 2, 2, 2, {HeadReduction::mean, Pooling::max, 3});
  ASSERT_EQ(sel.kept.size(), 2u);
  EXPECT_EQ(sel.kept[0], (Ids{3, 4, 5, 6}));
  EXPECT_EQ(sel.kept[1], (Ids{0, 1, 5, 6}));
  // Unpooled, head 0 ties 0, 2 and 3 at zero behind key 4 and key 1.
  const Selection raw = select_top_plus_window(state, 2, 2, 2, 3, {HeadReduction::mean, Pooling::none, 1});
  EXPECT_EQ(raw.kept[0], (Ids{0, 1, 4, 5, 6}));
  EXPECT_EQ(raw.kept[1], (Ids{0, 1, 3, 5, 6}));
}

// ---- PyramidKV budgets, official schedule ----

struct ScheduleRow {
  int layers, capacity, bottom, top, step;
  double effective_avg;  // the table's "effective avg C": total / L + w
};

TEST(PyramidBudgetsOfficial, EveryRowOfTheSpecTable) {
  // spec pyramidkv.md section 3.4, w = 8, beta = 20, a prompt long enough that the clamp never applies.
  const ScheduleRow rows[] = {
      {32, 64, 110, 17, 3, 71.5},     {32, 96, 172, 17, 5, 102.5},    {32, 128, 234, 17, 7, 133.5},
      {32, 256, 484, 19, 15, 259.5},  {32, 512, 983, 53, 30, 526.0},  {32, 1024, 1982, 60, 62, 1029.0},
      {32, 2048, 3978, 103, 125, 2048.5}, {80, 64, 110, 31, 1, 78.5}, {80, 128, 234, 76, 2, 163.0},
      {80, 2048, 3978, 107, 49, 2050.5},
  };
  const int w = 8;
  for (const ScheduleRow& r : rows) {
    SCOPED_TRACE(testing::Message() << "L=" << r.layers << " C=" << r.capacity);
    const auto k = pyramid_budgets_official(r.layers, 100000, r.capacity, w, 20);
    ASSERT_TRUE(k.has_value());
    ASSERT_EQ(int(k->size()), r.layers);
    EXPECT_EQ(k->front(), r.bottom);
    EXPECT_EQ(k->back(), r.top);
    for (int l = 1; l < r.layers; ++l) ASSERT_EQ((*k)[l - 1] - (*k)[l], r.step) << "layer " << l;
    const int total = std::accumulate(k->begin(), k->end(), 0);
    EXPECT_EQ(total, int((r.effective_avg - w) * r.layers));
    EXPECT_GE(total, r.layers * (r.capacity - w));  // flooring the step only ever adds (spec 6.1)
  }
}

TEST(PyramidBudgetsOfficial, GatesShortPromptsAndTheUniformRegime) {
  // C = 64, w = 8: a = 56. n < C: nothing compressed. C <= n < 2a = 112: uniform a.
  EXPECT_FALSE(pyramid_budgets_official(32, 63, 64, 8, 20).has_value());
  EXPECT_EQ(pyramid_budgets_official(32, 64, 64, 8, 20), std::vector<int>(32, 56));
  EXPECT_EQ(pyramid_budgets_official(32, 111, 64, 8, 20), std::vector<int>(32, 56));
  const auto at_2a = pyramid_budgets_official(32, 112, 64, 8, 20);
  ASSERT_TRUE(at_2a.has_value());
  EXPECT_NE(at_2a->front(), 56);
}

TEST(PyramidBudgetsOfficial, ClampGivesTheBottomLayerTheWholePrompt) {
  // C = 64, w = 8, a = 56, lo = 2, hi = 110; n = 112 has n - w = 104 <= hi: hi = 104, lo = 8, step = 96 / 31 = 3.
  const auto k = pyramid_budgets_official(32, 112, 64, 8, 20);
  ASSERT_TRUE(k.has_value());
  EXPECT_EQ(k->front(), 104);
  EXPECT_EQ(k->back(), 104 - 31 * 3);
  // hi == n - w exactly also clamps (the code's test is >=): n = 118, n - w = 110 = hi: unchanged numbers.
  EXPECT_EQ(pyramid_budgets_official(32, 118, 64, 8, 20)->front(), 110);
  EXPECT_EQ(pyramid_budgets_official(32, 118, 64, 8, 20)->back(), 17);
  for (int n = 64; n < 400; ++n) {
    const auto k = pyramid_budgets_official(32, n, 64, 8, 20);
    ASSERT_TRUE(k.has_value());
    for (int v : *k) {
      ASSERT_GE(v, 0) << "n=" << n;
      ASSERT_LE(v, n - 8) << "n=" << n;
    }
  }
}

TEST(PyramidBudgetsOfficial, OneLayerAndBudgetsBelowBeta) {
  EXPECT_EQ(pyramid_budgets_official(1, 100000, 128, 8, 20), std::vector<int>(1, 120));
  // a = 12 < beta: lo = 0, so the top layer keeps only the window (spec 9.2); 2a = 24, step = 24 / 31 = 0.
  EXPECT_EQ(pyramid_budgets_official(32, 100000, 20, 8, 20), std::vector<int>(32, 24));
  // 4 layers: hi = 24, step = 8: 24 16 8 0.
  EXPECT_EQ(pyramid_budgets_official(4, 100000, 20, 8, 20), (std::vector<int>{24, 16, 8, 0}));
}

// ---- PyramidKV budgets, exact-total schedule ----

TEST(PyramidBudgetsExact, HandComputedRoundingByLargestRemainder) {
  // L = 4, C = 18, w = 8: a = 10, beta 20: real 19.5, 13.1667, 6.8333, 0.5 (sum 40). Floors 19 13 6 0 = 38; the two
  // missing units go to layer 2 (.8333) and then layer 0 (.5 ties with layer 3; the lower layer wins).
  EXPECT_EQ(pyramid_budgets_exact(4, 100000, 18, 8, 20), (std::vector<int>{20, 13, 7, 0}));
}

TEST(PyramidBudgetsExact, ClampKeepsTheRealTotal) {
  // L = 3, a = 10: bottom 19.5 > n - w = 18, so hi = 18, lo = 2: 18 10 2.
  EXPECT_EQ(pyramid_budgets_exact(3, 26, 18, 8, 20), (std::vector<int>{18, 10, 2}));
  // L = 4: 18, 12.667, 7.333, 2 -> floors 18 12 7 2 = 39, one unit to layer 1.
  EXPECT_EQ(pyramid_budgets_exact(4, 26, 18, 8, 20), (std::vector<int>{18, 13, 7, 2}));
  // n == C: n - w = a, the clamp makes it uniform. n < C: nothing compressed.
  EXPECT_EQ(pyramid_budgets_exact(4, 18, 18, 8, 20), std::vector<int>(4, 10));
  EXPECT_FALSE(pyramid_budgets_exact(4, 17, 18, 8, 20).has_value());
  EXPECT_EQ(pyramid_budgets_exact(1, 100, 18, 8, 20), std::vector<int>(1, 10));
}

TEST(PyramidBudgetsExact, TotalIsExactlyLTimesAAndTheShapeHolds) {
  for (int layers : {1, 2, 3, 7, 32, 80, 126}) {
    for (int capacity : {9, 20, 64, 96, 128, 256, 512, 1000, 2048}) {
      for (int beta : {1, 14, 20, 33}) {
        for (int n : {capacity, capacity + 1, 2 * capacity, 3 * capacity - 5, 100000}) {
          SCOPED_TRACE(testing::Message() << "L=" << layers << " C=" << capacity << " beta=" << beta << " n=" << n);
          const int w = 8, a = capacity - w;
          const auto k = pyramid_budgets_exact(layers, n, capacity, w, beta);
          ASSERT_TRUE(k.has_value());
          ASSERT_EQ(int(k->size()), layers);
          EXPECT_EQ(std::accumulate(k->begin(), k->end(), int64_t(0)), int64_t(layers) * a);
          for (int l = 0; l < layers; ++l) {
            ASSERT_GE((*k)[l], 0);
            ASSERT_LE((*k)[l], n - w);
            if (l > 0) {
              ASSERT_LE((*k)[l], (*k)[l - 1]);
            }
          }
        }
      }
    }
  }
}

TEST(PyramidBudgetsExact, LongPromptMatchesThePaperFormula) {
  // L = 32, C = 128, w = 8, beta = 20: a = 120, top 6, bottom 234, step 228 / 31 = 7.3548...: every layer is within
  // one unit of the real value and the ends are exact.
  const auto k = pyramid_budgets_exact(32, 100000, 128, 8, 20);
  ASSERT_TRUE(k.has_value());
  EXPECT_EQ(k->front(), 234);
  EXPECT_EQ(k->back(), 6);
  for (int l = 0; l < 32; ++l) EXPECT_LT(std::abs((*k)[l] - (234.0 - 228.0 * l / 31)), 1.0) << l;
}

}  // namespace
}  // namespace strata
