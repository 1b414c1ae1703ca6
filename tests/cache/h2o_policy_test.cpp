#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cache/policies/policies.h"
#include "tests/cache/policy_test_states.h"

namespace strata {
namespace {

using Ids = std::vector<int32_t>;

std::unique_ptr<CompressionPolicy> h2o(const std::string& params, int n_heads = 1, int n_kv_heads = 1) {
  return make_h2o_policy(parse_policy_spec("h2o" + (params.empty() ? "" : ":" + params)),
                         test::policy_context(n_heads, n_kv_heads));
}

using test::at;

// The original positions each KV head holds, compacted as the cache does.
void apply(std::vector<std::vector<int>>& positions, const Selection& sel) {
  ASSERT_EQ(sel.kept.size(), positions.size());
  for (size_t g = 0; g < positions.size(); ++g) {
    std::vector<int> next;
    for (int32_t e : sel.kept[g]) next.push_back(positions[g][e]);
    positions[g] = next;
  }
}

// 4 query heads, 2 KV heads, 8 prompt entries (columns 6 and 7 are the window).
const std::vector<float> kGqaSums = {
    5, 0, 1, 0, 0, 0, 9, 9,  // head 0 -> KV 0
    1, 0, 1, 4, 0, 2, 9, 9,  // head 1 -> KV 0: mean 3 0 1 2 0 1, max 5 0 1 4 0 2
    0, 2, 0, 0, 3, 0, 9, 9,  // head 2 -> KV 1
    0, 2, 0, 0, 0, 1, 9, 9,  // head 3 -> KV 1: mean 0 2 0 0 1.5 .5, max 0 2 0 0 3 1
};

TEST(H2oPolicy, OneShotKeepsHeavyHittersPerKvHeadPlusTheWindow) {
  auto p = h2o("budget=5,window=2", 4, 2);
  EXPECT_EQ(p->name(), "h2o");
  // Accumulated attention over ALL prompt rows: rows from 0.
  EXPECT_EQ(p->needs(at(8, 0, 0, {})).prefill_rows_from, 0);
  EXPECT_FALSE(p->needs(at(8, 0, 0, {})).decode_probabilities);
  const std::optional<Selection> sel = p->on_prefill_end(at(8, 8, 0, kGqaSums));
  ASSERT_TRUE(sel.has_value());
  ASSERT_EQ(sel->kept.size(), 2u);
  // KV 0 (mean 3 0 1 2 0 1): 0, 3, then 2 and 5 tie at 1 and the lower index wins.
  EXPECT_EQ(sel->kept[0], (Ids{0, 2, 3, 6, 7}));
  EXPECT_EQ(sel->kept[1], (Ids{1, 4, 5, 6, 7}));
  // Nothing more while decoding, and no decode statistics asked for.
  EXPECT_FALSE(p->needs(at(8, 5, 1, {})).decode_probabilities);
  EXPECT_FALSE(p->on_decode_step(at(8, 6, 1, {})).has_value());
}

TEST(H2oPolicy, MaxAggregationPicksTheSharpestHead) {
  auto p = h2o("budget=5,window=2,agg=max", 4, 2);
  const std::optional<Selection> sel = p->on_prefill_end(at(8, 8, 0, kGqaSums));
  ASSERT_TRUE(sel.has_value());
  EXPECT_EQ(sel->kept[0], (Ids{0, 3, 5, 6, 7}));  // max 5 0 1 4 0 2
  EXPECT_EQ(sel->kept[1], (Ids{1, 4, 5, 6, 7}));  // max 0 2 0 0 3 1
}

TEST(H2oPolicy, NoPooling) {
  // A lone peak keeps only itself: no neighbours ride along as they would under SnapKV's pooling.
  const std::vector<float> sums = {0, 0, 0, 8, 0, 0, 1, 1, 1};
  const std::optional<Selection> sel = h2o("budget=4,window=3")->on_prefill_end(at(9, 9, 0, sums));
  ASSERT_TRUE(sel.has_value());
  EXPECT_EQ(sel->kept[0], (Ids{3, 6, 7, 8}));
}

TEST(H2oPolicy, ShortPromptsAndLargeBudgetsKeepEverythingWithoutStatistics) {
  auto p = h2o("budget=5,window=2");
  for (int n : {1, 2, 5}) {  // shorter than the window, between, equal to the budget
    EXPECT_EQ(p->needs(at(n, 0, 0, {})).prefill_rows_from, -1) << n;
    EXPECT_FALSE(p->on_prefill_end(at(n, n, 0, {})).has_value()) << n;
  }
  EXPECT_FALSE(h2o("budget=1000")->on_prefill_end(at(200, 200, 0, {})).has_value());
}

TEST(H2oPolicy, FractionBudgets) {
  // 50% of 8 = 4: 2 heavy + 2 window. KV 0 mean: 3 0 1 2 0 1 -> 0, 3.
  auto p = h2o("budget=50%,window=2", 4, 2);
  const std::optional<Selection> sel = p->on_prefill_end(at(8, 8, 0, kGqaSums));
  ASSERT_TRUE(sel.has_value());
  EXPECT_EQ(sel->kept[0], (Ids{0, 3, 6, 7}));
  EXPECT_EQ(sel->kept[1], (Ids{1, 4, 6, 7}));
}

TEST(H2oPolicy, PerStepEvictsTheLowestAccumulatedScoreEachStepAndCompactsTheScores) {
  // 2 query heads, 2 KV heads; budget 4, window 1 (dyadic numbers, so every sum is exact).
  auto p = h2o("budget=4,window=1,mode=per_step", 2, 2);
  EXPECT_EQ(p->needs(at(5, 0, 0, {})).prefill_rows_from, 0);
  std::vector<std::vector<int>> positions = {{0, 1, 2, 3, 4}, {0, 1, 2, 3, 4}};

  const std::vector<float> prompt = {
      2.0, 0.5, 1.0, 0.25, 1.5,  // head 0: top 3 of entries 0..3 -> 0, 2, 1
      1.0, 0.75, 0.125, 0.5, 1.5,  // head 1: -> 0, 1, 3
  };
  const std::optional<Selection> pre = p->on_prefill_end(at(5, 5, 0, prompt));
  ASSERT_TRUE(pre.has_value());
  EXPECT_EQ(pre->kept[0], (Ids{0, 1, 2, 4}));
  EXPECT_EQ(pre->kept[1], (Ids{0, 1, 3, 4}));
  apply(positions, *pre);
  // Scores now: head 0 [2, .5, 1, 1.5] at positions 0 1 2 4; head 1 [1, .75, .5, 1.5] at positions 0 1 3 4.

  struct Step {
    std::vector<float> probs;  // [2][5]: this step's query, the new token last
    Ids kept0, kept1;
    std::vector<int> positions0, positions1;
  };
  const Step steps[] = {
      // head 0: 2.125 1.125 1.125 1.5 | .125: entries 1 and 2 tie, the lower index stays, entry 2 (position 2) goes.
      // head 1: 1.25 .75 1 1.625 | .125: entry 1 (position 1) goes.
      {{0.125, 0.625, 0.125, 0, 0.125, 0.25, 0, 0.5, 0.125, 0.125},
       {0, 1, 3, 4}, {0, 2, 3, 4}, {0, 1, 4, 5}, {0, 3, 4, 5}},
      // head 0: 2.125 1.125 1.5 .875 | .25: position 5 left the window with the lowest score and goes.
      // head 1: 1.75 1 1.625 .125 | .5: position 5 goes.
      {{0, 0, 0, 0.75, 0.25, 0.5, 0, 0, 0, 0.5}, {0, 1, 2, 4}, {0, 1, 2, 4}, {0, 1, 4, 6}, {0, 3, 4, 6}},
      // head 0: 2.125 1.625 1.5 .25 | .5: position 6 goes.
      // head 1: 1.75 1 1.625 1 | .5: entries 1 and 3 tie at 1; the newer (entry 3, position 6) goes.
      {{0, 0.5, 0, 0, 0.5, 0, 0, 0, 0.5, 0.5}, {0, 1, 2, 4}, {0, 1, 2, 4}, {0, 1, 4, 7}, {0, 3, 4, 7}},
  };
  int step_no = 0;
  for (const Step& s : steps) {
    ++step_no;
    SCOPED_TRACE(testing::Message() << "step " << step_no);
    EXPECT_TRUE(p->needs(at(5, 4, step_no, {})).decode_probabilities);
    for (auto& pos : positions) pos.push_back(4 + step_no);
    const std::optional<Selection> sel = p->on_decode_step(at(5, 5, step_no, s.probs));
    ASSERT_TRUE(sel.has_value());
    EXPECT_EQ(sel->kept[0], s.kept0);
    EXPECT_EQ(sel->kept[1], s.kept1);
    apply(positions, *sel);
    EXPECT_EQ(positions[0], s.positions0);
    EXPECT_EQ(positions[1], s.positions1);
  }
}

TEST(H2oPolicy, PerStepAfterAShortPromptAccumulatesUntilTheBudgetIsExceeded) {
  auto p = h2o("budget=4,window=1,mode=per_step");
  // The prompt fits, but its scores are still needed for later evictions.
  EXPECT_EQ(p->needs(at(3, 0, 0, {})).prefill_rows_from, 0);
  EXPECT_FALSE(p->on_prefill_end(at(3, 3, 0, {1, 0.25, 0.5})).has_value());
  EXPECT_FALSE(p->on_decode_step(at(3, 4, 1, {0.25, 0.25, 0.25, 0.25})).has_value());
  // 1.25 1 .75 .25 | .5 -> entry 3 goes.
  const std::optional<Selection> sel = p->on_decode_step(at(3, 5, 2, {0, 0.5, 0, 0, 0.5}));
  ASSERT_TRUE(sel.has_value());
  EXPECT_EQ(sel->kept[0], (Ids{0, 1, 2, 4}));
  // Compacted 1.25 1 .75 .5, plus this step's .5 .5 0 0 and 0 for the new token: entry 3 goes again.
  const std::optional<Selection> next = p->on_decode_step(at(3, 5, 3, {0.5, 0.5, 0, 0, 0}));
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(next->kept[0], (Ids{0, 1, 2, 4}));
}

TEST(H2oPolicy, PerStepOnAQuantizedPoolEvictsAGroupsWorthAtOnce) {
  // decode_eviction_batch 2 stands in for a quantized pool's 32: the layer may hold one entry past the budget, and
  // the step that brings it two past evicts both, the two lowest accumulated scores.
  PolicyContext context = test::policy_context(1, 1);
  context.decode_eviction_batch = 2;
  auto p = make_h2o_policy(parse_policy_spec("h2o:budget=4,window=1,mode=per_step"), context);
  ASSERT_FALSE(p->on_prefill_end(at(4, 4, 0, {1, 0.25, 0.5, 2})).has_value());
  EXPECT_FALSE(p->on_decode_step(at(4, 5, 1, {0, 0, 0, 0, 0})).has_value()) << "one past the budget: kept";
  // Accumulated 1 .25 .5 2 0 | window: the new token. The lowest two of the first five go: entries 1 and 4.
  const std::optional<Selection> sel = p->on_decode_step(at(4, 6, 2, {0, 0, 0, 0, 0, 1}));
  ASSERT_TRUE(sel.has_value());
  EXPECT_EQ(sel->kept[0], (Ids{0, 2, 3, 5}));
}

TEST(H2oPolicy, PerStepRejectsHooksWithoutTheirStatistics) {
  auto p = h2o("budget=4,window=1,mode=per_step");
  EXPECT_THROW(p->on_prefill_end(at(5, 5, 0, {})), std::logic_error);
  EXPECT_THROW(p->on_decode_step(at(5, 6, 1, {0, 0, 0, 0, 0, 1})), std::logic_error);  // no prompt scores yet
  ASSERT_NO_THROW(p->on_prefill_end(at(3, 3, 0, {1, 1, 1})));
  EXPECT_THROW(p->on_decode_step(at(3, 4, 1, {})), std::logic_error);
  EXPECT_THROW(p->on_decode_step(at(3, 5, 1, {0, 0, 0, 0, 1})), std::logic_error);  // two entries arrived at once
}

TEST(H2oPolicy, ParameterErrorsNameTheParameter) {
  const std::pair<std::string, std::string> cases[] = {
      {"budget=8", "budget"},           // C <= window (8 by default)
      {"budget=4,window=4", "budget"},  //
      {"budget=abc", "budget"},         //
      {"window=-1", "window"},          //
      {"mode=rolling", "mode"},         //
      {"agg=median", "agg"},            //
      {"kernel=7", "kernel"},           // h2o does not pool
  };
  for (const auto& [params, param] : cases) {
    try {
      h2o(params);
      ADD_FAILURE() << params << " was accepted";
    } catch (const PolicyError& e) {
      EXPECT_EQ(e.param(), param) << params << ": " << e.what();
    }
  }
  EXPECT_NO_THROW(h2o("budget=9,window=8,mode=per_step,agg=max"));
  EXPECT_NO_THROW(h2o("budget=20%"));
}

}  // namespace
}  // namespace strata
