#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cache/policies/policies.h"
#include "tests/cache/policy_test_states.h"

namespace strata {
namespace {

using Ids = std::vector<int32_t>;

std::unique_ptr<CompressionPolicy> snapkv(const std::string& params, int n_heads = 1, int n_kv_heads = 1) {
  return make_snapkv_policy(parse_policy_spec("snapkv" + (params.empty() ? "" : ":" + params)),
                            test::policy_context(n_heads, n_kv_heads));
}

using test::prompt_end;
using test::start;

// One head: the given scores on the first keys, then `window` window columns of 100 (never selected: window
// columns are dropped from the scores).
std::vector<float> scores_then_window(std::vector<float> scores, int window) {
  scores.insert(scores.end(), window, 100.0f);
  return scores;
}

// Scored keys 0 6 0 0 0 5 0 4, then a window of 2.
const std::vector<float> kPeaks = scores_then_window({0, 6, 0, 0, 0, 5, 0, 4}, 2);

TEST(SnapKvPolicy, MaxPoolingKeepsThePeakAndItsNeighbours) {
  // 8 scored keys + window 2; keep 3. Max k=3 pools 0 6 0 0 0 5 0 4 to 6 6 6 0 5 5 5 4 (the last cell sees 0 and 4
  // only: the padding never wins): the peak at 1 brings 0 and 2. Unpooled, the top 3 would be 1, 5, 7.
  auto p = snapkv("budget=5,window=2,kernel=3,pool=max");
  const std::optional<Selection> sel = p->on_prefill_end(prompt_end(10, kPeaks));
  ASSERT_TRUE(sel.has_value());
  ASSERT_EQ(sel->kept.size(), 1u);
  EXPECT_EQ(sel->kept[0], (Ids{0, 1, 2, 8, 9}));
}

TEST(SnapKvPolicy, AvgPoolingDividesByTheKernelAtTheEdges) {
  // Avg k=3 pools 0 6 0 0 0 5 0 4 to 2 2 2 0 5/3 5/3 3 4/3: key 6, then the lower two of the three tied at 2.
  auto p = snapkv("budget=5,window=2,kernel=3,pool=avg");
  const std::optional<Selection> sel = p->on_prefill_end(prompt_end(10, kPeaks));
  ASSERT_TRUE(sel.has_value());
  EXPECT_EQ(sel->kept[0], (Ids{0, 1, 6, 8, 9}));
  // Keep 1: key 6 (3) beats the edge cell 0 ((0 + 0 + 6) / 3 = 2). Dividing the edge by its 2 real cells would
  // score it 3 and put it first.
  auto keep_one = snapkv("budget=3,window=2,kernel=3,pool=avg");
  const std::optional<Selection> one = keep_one->on_prefill_end(prompt_end(10, kPeaks));
  ASSERT_TRUE(one.has_value());
  EXPECT_EQ(one->kept[0], (Ids{6, 8, 9}));
}

TEST(SnapKvPolicy, ModesSetWindowKernelAndPooling) {
  // Scored keys 3 3 0 0 0 0 0 5; keep 1. Unpooled the winner is 7; avg k=5 gives 1.2 1.2 1.2 .6 0 1 1 1 -> 0;
  // max k=7 gives 3 3 3 3 5 5 5 5 -> 4.
  const std::vector<float> scores = {3, 3, 0, 0, 0, 0, 0, 5};
  // mode=code (default): w = 32, k = 5, avg.
  auto code = snapkv("budget=33");
  EXPECT_EQ(code->needs(start(40)).prefill_rows_from, 8);
  std::optional<Selection> sel = code->on_prefill_end(prompt_end(40, scores_then_window(scores, 32)));
  ASSERT_TRUE(sel.has_value());
  EXPECT_EQ(sel->kept[0].size(), 33u);
  EXPECT_EQ(sel->kept[0].front(), 0);
  EXPECT_EQ(sel->kept[0][1], 8);
  // mode=pyramidkv_runs: w = 8, k = 7, max.
  auto runs = snapkv("mode=pyramidkv_runs,budget=9");
  EXPECT_EQ(runs->needs(start(16)).prefill_rows_from, 8);
  sel = runs->on_prefill_end(prompt_end(16, scores_then_window(scores, 8)));
  ASSERT_TRUE(sel.has_value());
  EXPECT_EQ(sel->kept[0], (Ids{4, 8, 9, 10, 11, 12, 13, 14, 15}));
  // Explicit parameters override the mode one by one.
  sel = snapkv("mode=pyramidkv_runs,budget=9,kernel=1")->on_prefill_end(prompt_end(16, scores_then_window(scores, 8)));
  ASSERT_TRUE(sel.has_value());
  EXPECT_EQ(sel->kept[0].front(), 7);
  sel = snapkv("mode=pyramidkv_runs,budget=9,kernel=5,pool=avg")
            ->on_prefill_end(prompt_end(16, scores_then_window(scores, 8)));
  ASSERT_TRUE(sel.has_value());
  EXPECT_EQ(sel->kept[0].front(), 0);
}

TEST(SnapKvPolicy, GqaReducesQueryHeadsBeforePoolingWithDifferentWinnersPerKvHead) {
  // 4 query heads, 2 KV heads, 8 scored keys + window 2, keep 2, kernel 1 (no pooling) to isolate the reduction.
  const std::vector<float> sums = {
      4, 3, 0, 2.5, 0, 0, 0, 0, 9, 9,  // head 0 -> KV 0
      0, 3, 0, 2.5, 0, 0, 0, 0, 9, 9,  // head 1 -> KV 0: mean 2 3 0 2.5, max 4 3 0 2.5
      0, 0, 0, 0, 1, 0, 0, 2, 9, 9,    // head 2 -> KV 1
      0, 0, 0, 0, 1, 0, 0, 0, 9, 9,    // head 3 -> KV 1: mean .. 1 .. 1, max .. 1 .. 2
  };
  const std::optional<Selection> mean =
      snapkv("budget=4,window=2,kernel=1", 4, 2)->on_prefill_end(prompt_end(10, sums));
  ASSERT_TRUE(mean.has_value());
  ASSERT_EQ(mean->kept.size(), 2u);
  EXPECT_EQ(mean->kept[0], (Ids{1, 3, 8, 9}));
  EXPECT_EQ(mean->kept[1], (Ids{4, 7, 8, 9}));
  const std::optional<Selection> max =
      snapkv("budget=4,window=2,kernel=1,agg=max", 4, 2)->on_prefill_end(prompt_end(10, sums));
  ASSERT_TRUE(max.has_value());
  EXPECT_EQ(max->kept[0], (Ids{0, 1, 8, 9}));
  EXPECT_EQ(max->kept[1], (Ids{4, 7, 8, 9}));
}

TEST(SnapKvPolicy, ReductionHappensBeforePooling) {
  // 2 query heads, 1 KV head, 5 scored keys + window 1, keep 1, max k=3. Mean first: 0 2 0 1.5 0, pooled
  // 2 2 2 1.5 1.5 -> key 0. Pooling each head first (4 4 4 0 0 and 0 0 3 3 3) and then averaging would give
  // 2 2 3.5 1.5 1.5 -> key 2.
  const std::vector<float> sums = {
      0, 4, 0, 0, 0, 5,  //
      0, 0, 0, 3, 0, 5,  //
  };
  const std::optional<Selection> sel =
      snapkv("budget=2,window=1,kernel=3,pool=max", 2, 1)->on_prefill_end(prompt_end(6, sums));
  ASSERT_TRUE(sel.has_value());
  EXPECT_EQ(sel->kept[0], (Ids{0, 5}));
}

TEST(SnapKvPolicy, ShortPromptsAndLargeBudgetsKeepEverythingWithoutStatistics) {
  auto p = snapkv("budget=5,window=2");
  for (int n : {1, 2, 4, 5}) {  // shorter than the window, up to the budget
    EXPECT_EQ(p->needs(start(n)).prefill_rows_from, -1) << n;
    EXPECT_FALSE(p->on_prefill_end(prompt_end(n, {})).has_value()) << n;
  }
  EXPECT_EQ(p->needs(start(6)).prefill_rows_from, 4);
  auto defaults = snapkv("");
  EXPECT_EQ(defaults->needs(start(1)).prefill_rows_from, -1);  // shorter than the 32-token window
  EXPECT_EQ(defaults->needs(start(128)).prefill_rows_from, -1);
  EXPECT_EQ(defaults->needs(start(129)).prefill_rows_from, 97);
  EXPECT_FALSE(snapkv("budget=1000")->on_prefill_end(prompt_end(200, {})).has_value());
}

TEST(SnapKvPolicy, NothingHappensWhileDecoding) {
  auto p = snapkv("budget=5,window=2");
  LayerState step = start(10);
  step.n_entries = 6;
  step.n_generated = 1;
  const PolicyNeeds needs = p->needs(step);
  EXPECT_EQ(needs.prefill_rows_from, -1);
  EXPECT_FALSE(needs.decode_probabilities);
  EXPECT_FALSE(p->on_decode_step(step).has_value());
}

TEST(SnapKvPolicy, FractionBudgetsResolveAgainstThePrompt) {
  // 50% of 10 = 5: 3 selected + window 2 (max k=3 as in the first test).
  auto p = snapkv("budget=50%,window=2,kernel=3,pool=max");
  EXPECT_EQ(p->needs(start(10)).prefill_rows_from, 8);
  const std::optional<Selection> sel = p->on_prefill_end(prompt_end(10, kPeaks));
  ASSERT_TRUE(sel.has_value());
  EXPECT_EQ(sel->kept[0], (Ids{0, 1, 2, 8, 9}));
  // 10% of 10 = 1 <= window: the window alone.
  const std::optional<Selection> tiny = snapkv("budget=10%,window=2")->on_prefill_end(prompt_end(10, kPeaks));
  ASSERT_TRUE(tiny.has_value());
  EXPECT_EQ(tiny->kept[0], (Ids{8, 9}));
}

TEST(SnapKvPolicy, ParameterErrorsNameTheParameter) {
  const std::pair<std::string, std::string> cases[] = {
      {"budget=32", "budget"},                     // C <= window (32 in mode=code)
      {"mode=pyramidkv_runs,budget=8", "budget"},  // window 8 there
      {"budget=5,window=5", "budget"},             //
      {"window=0", "window"},                      //
      {"kernel=4", "kernel"},                      //
      {"kernel=0", "kernel"},                      //
      {"pool=min", "pool"},                        //
      {"agg=sum", "agg"},                          //
      {"mode=paper", "mode"},                      //
      {"beta=20", "beta"},                         // pyramidkv's, not snapkv's
  };
  for (const auto& [params, param] : cases) {
    try {
      snapkv(params);
      ADD_FAILURE() << params << " was accepted";
    } catch (const PolicyError& e) {
      EXPECT_EQ(e.param(), param) << params << ": " << e.what();
    }
  }
  EXPECT_NO_THROW(snapkv("mode=pyramidkv_runs,budget=9"));
  EXPECT_NO_THROW(snapkv("budget=10%"));
}

}  // namespace
}  // namespace strata
