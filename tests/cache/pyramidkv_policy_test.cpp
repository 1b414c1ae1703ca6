#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cache/policies/policies.h"
#include "tests/cache/policy_test_states.h"
#include "cache/policies/selection.h"

namespace strata {
namespace {

using Ids = std::vector<int32_t>;

std::unique_ptr<CompressionPolicy> pyramidkv(const std::string& params, int layer, int n_layers, int n_heads = 1,
                                             int n_kv_heads = 1) {
  return make_pyramidkv_policy(parse_policy_spec("pyramidkv" + (params.empty() ? "" : ":" + params)),
                               test::policy_context(n_heads, n_kv_heads, layer, n_layers));
}

using test::prompt_end;
using test::start;

// Entries a layer holds after the prompt: its selection's length, or the whole prompt.
int held(CompressionPolicy& policy, const LayerState& state) {
  const std::optional<Selection> sel = policy.on_prefill_end(state);
  return sel ? int(sel->kept.at(0).size()) : state.n_entries;
}

struct ScheduleRow {
  int layers, capacity, bottom, top;
  double effective_avg;  // total entries / L, window included
};

TEST(PyramidKvPolicy, OfficialScheduleOfEveryTableRowThroughThePolicies) {
  // spec pyramidkv.md section 3.4 (w = 8, beta = 20, the defaults), a 4096-token prompt: long enough that no row is
  // clamped (n - w > bottom) or uniform (n >= 2a).
  const ScheduleRow rows[] = {
      {32, 64, 110, 17, 71.5},     {32, 96, 172, 17, 102.5},    {32, 128, 234, 17, 133.5},  {32, 256, 484, 19, 259.5},
      {32, 512, 983, 53, 526.0},   {32, 1024, 1982, 60, 1029.0}, {32, 2048, 3978, 103, 2048.5},
      {80, 64, 110, 31, 78.5},     {80, 128, 234, 76, 163.0},   {80, 2048, 3978, 107, 2050.5},
  };
  const int n = 4096;
  const std::vector<float> sums(n, 1.0f);
  for (const ScheduleRow& r : rows) {
    SCOPED_TRACE(testing::Message() << "L=" << r.layers << " C=" << r.capacity);
    int total = 0;
    for (int layer = 0; layer < r.layers; ++layer) {
      auto p = pyramidkv("budget=" + std::to_string(r.capacity), layer, r.layers);
      ASSERT_EQ(p->needs(start(n)).prefill_rows_from, n - 8);
      const int entries = held(*p, prompt_end(n, sums));
      if (layer == 0) {
        EXPECT_EQ(entries, r.bottom + 8);
      }
      if (layer == r.layers - 1) {
        EXPECT_EQ(entries, r.top + 8);
      }
      total += entries;
    }
    EXPECT_EQ(total, int(r.effective_avg * r.layers));
  }
}

TEST(PyramidKvPolicy, ExactScheduleKeepsExactlyLTimesC) {
  const int n = 4096;
  const std::vector<float> sums(n, 1.0f);
  for (int capacity : {64, 128, 2048}) {
    const auto k = pyramid_budgets_exact(32, n, capacity, 8, 20);
    ASSERT_TRUE(k.has_value());
    int total = 0;
    for (int layer = 0; layer < 32; ++layer) {
      auto p = pyramidkv("schedule=exact,budget=" + std::to_string(capacity), layer, 32);
      const int entries = held(*p, prompt_end(n, sums));
      EXPECT_EQ(entries, (*k)[layer] + 8) << "C=" << capacity << " layer " << layer;
      total += entries;
    }
    EXPECT_EQ(total, 32 * capacity);
  }
}

TEST(PyramidKvPolicy, EachLayerSelectsItsOwnBudgetOfPooledScores) {
  // L = 3, C = 5, w = 2, beta = 2: a = 3, lo = 1, hi = 5, step 2: k = 5 3 1. Scored keys 0 0 9 0 0 0 0 0 0 4, max
  // k=3 pooled 0 9 9 9 0 0 0 0 4 4; window 10, 11.
  const std::vector<float> sums = {0, 0, 9, 0, 0, 0, 0, 0, 0, 4, 100, 100};
  const Ids expected[] = {{1, 2, 3, 8, 9, 10, 11}, {1, 2, 3, 10, 11}, {1, 10, 11}};
  for (int layer = 0; layer < 3; ++layer) {
    auto p = pyramidkv("budget=5,window=2,beta=2,kernel=3", layer, 3);
    EXPECT_EQ(p->needs(start(12)).prefill_rows_from, 10);
    const std::optional<Selection> sel = p->on_prefill_end(prompt_end(12, sums));
    ASSERT_TRUE(sel.has_value()) << layer;
    EXPECT_EQ(sel->kept[0], expected[layer]) << "layer " << layer;
  }
}

TEST(PyramidKvPolicy, DefaultsAreWindow8MaxPoolKernel7) {
  // Scored keys 3 3 0 0 0 0 0 5 then a window of 8; keep 1 (budget 9, one layer). Max k=7: 3 3 3 3 5 5 5 5 -> key 4
  // (unpooled: 7; SnapKV's avg k=5: 0).
  std::vector<float> sums = {3, 3, 0, 0, 0, 0, 0, 5};
  sums.insert(sums.end(), 8, 100.0f);
  auto p = pyramidkv("budget=9", 0, 1);
  EXPECT_EQ(p->needs(start(16)).prefill_rows_from, 8);
  const std::optional<Selection> sel = p->on_prefill_end(prompt_end(16, sums));
  ASSERT_TRUE(sel.has_value());
  EXPECT_EQ(sel->kept[0], (Ids{4, 8, 9, 10, 11, 12, 13, 14, 15}));
  // Budget 128 by default: a 1000-token prompt is compressed, a 128-token one is not.
  EXPECT_EQ(pyramidkv("", 0, 32)->needs(start(1000)).prefill_rows_from, 992);
  EXPECT_EQ(pyramidkv("", 0, 32)->needs(start(128)).prefill_rows_from, -1);
}

TEST(PyramidKvPolicy, ClampedBottomLayerKeepsThePromptWithoutStatistics) {
  // L = 3, C = 5, w = 2, beta = 2, n = 7: hi = 5 >= n - w = 5, so the clamp holds hi at 5: k = 5 3 1, and layer 0
  // keeps all 7 entries.
  auto bottom = pyramidkv("budget=5,window=2,beta=2,kernel=3", 0, 3);
  EXPECT_EQ(bottom->needs(start(7)).prefill_rows_from, -1);
  EXPECT_FALSE(bottom->on_prefill_end(prompt_end(7, {})).has_value());
  const std::vector<float> sums = {0, 0, 9, 0, 0, 100, 100};
  auto middle = pyramidkv("budget=5,window=2,beta=2,kernel=3", 1, 3);
  EXPECT_EQ(middle->needs(start(7)).prefill_rows_from, 5);
  const std::optional<Selection> sel = middle->on_prefill_end(prompt_end(7, sums));
  ASSERT_TRUE(sel.has_value());
  EXPECT_EQ(sel->kept[0], (Ids{1, 2, 3, 5, 6}));
}

TEST(PyramidKvPolicy, UniformBelowTwiceTheNonWindowBudget) {
  // C = 10, w = 2: a = 8; 10 <= n = 12 < 16 gives every layer C (the code's second gate).
  const std::vector<float> sums(12, 1.0f);
  for (int layer = 0; layer < 3; ++layer) {
    auto p = pyramidkv("budget=10,window=2", layer, 3);
    EXPECT_EQ(held(*p, prompt_end(12, sums)), 10) << layer;
  }
}

TEST(PyramidKvPolicy, ShortPromptsAndLargeBudgetsKeepEverything) {
  for (int layer : {0, 31}) {
    auto p = pyramidkv("budget=64", layer, 32);
    for (int n : {1, 8, 63, 64}) {  // shorter than the window, shorter than C, equal to C (k = a = n - w)
      EXPECT_EQ(p->needs(start(n)).prefill_rows_from, -1) << n;
      EXPECT_FALSE(p->on_prefill_end(prompt_end(n, {})).has_value()) << n;
    }
    EXPECT_FALSE(pyramidkv("budget=1000", layer, 32)->on_prefill_end(prompt_end(200, {})).has_value());
  }
}

TEST(PyramidKvPolicy, NothingHappensWhileDecoding) {
  auto p = pyramidkv("", 5, 32);
  LayerState step = start(1000);
  step.n_entries = 200;
  step.n_generated = 3;
  EXPECT_EQ(p->needs(step).prefill_rows_from, -1);
  EXPECT_FALSE(p->needs(step).decode_probabilities);
  EXPECT_FALSE(p->on_decode_step(step).has_value());
}

TEST(PyramidKvPolicy, GqaGroupsPickTheirOwnTokens) {
  // One layer (k = a = 3), 4 query heads, 2 KV heads, window 1, max k=3. KV 0: mean .5 0 0 0 0 2.5 0 pools to
  // .5 .5 0 0 2.5 2.5 2.5 -> 4 5 6. KV 1: mean 0 1.5 0 0 0 0 0 pools to 1.5 1.5 1.5 0 0 0 0 -> 0 1 2.
  const std::vector<float> sums = {
      0, 0, 0, 0, 0, 5, 0, 9,  //
      1, 0, 0, 0, 0, 0, 0, 9,  //
      0, 3, 0, 0, 0, 0, 0, 9,  //
      0, 0, 0, 0, 0, 0, 0, 9,  //
  };
  const std::optional<Selection> sel =
      pyramidkv("budget=4,window=1,kernel=3", 0, 1, 4, 2)->on_prefill_end(prompt_end(8, sums));
  ASSERT_TRUE(sel.has_value());
  ASSERT_EQ(sel->kept.size(), 2u);
  EXPECT_EQ(sel->kept[0], (Ids{4, 5, 6, 7}));
  EXPECT_EQ(sel->kept[1], (Ids{0, 1, 2, 7}));
}

TEST(PyramidKvPolicy, FractionBudgetsAreTheAverageOfThisPrompt) {
  // 50% of 12 = 6: a = 4, beta 2: lo 2, hi 6, step 2: 6 4 2 non-window entries per layer.
  const std::vector<float> sums(12, 1.0f);
  const int expected[] = {8, 6, 4};
  for (int layer = 0; layer < 3; ++layer) {
    auto p = pyramidkv("budget=50%,window=2,beta=2", layer, 3);
    EXPECT_EQ(held(*p, prompt_end(12, sums)), expected[layer]) << layer;
  }
  // 10% of 12 = 2 <= window: the window alone, in every layer.
  EXPECT_EQ(held(*pyramidkv("budget=10%,window=2", 0, 3), prompt_end(12, sums)), 2);
}

TEST(PyramidKvPolicy, ParameterErrorsNameTheParameter) {
  const std::pair<std::string, std::string> cases[] = {
      {"budget=8", "budget"},           // C <= window (8 by default)
      {"budget=4,window=5", "budget"},  //
      {"window=0", "window"},           //
      {"kernel=2", "kernel"},           //
      {"pool=none", "pool"},            //
      {"beta=0", "beta"},               //
      {"beta=2.5", "beta"},             //
      {"schedule=paper", "schedule"},   //
      {"agg=min", "agg"},               //
      {"mode=code", "mode"},            // snapkv's, not pyramidkv's
  };
  for (const auto& [params, param] : cases) {
    try {
      pyramidkv(params, 0, 32);
      ADD_FAILURE() << params << " was accepted";
    } catch (const PolicyError& e) {
      EXPECT_EQ(e.param(), param) << params << ": " << e.what();
    }
  }
  EXPECT_NO_THROW(pyramidkv("budget=9,window=8,kernel=1,pool=avg,beta=14,schedule=exact,agg=max", 31, 32));
}

}  // namespace
}  // namespace strata
