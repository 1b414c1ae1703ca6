// SpindleKV's budget schedule (cache/policies/spindlekv_budget.h) and selection (cache/policies/spindlekv_policy.cpp)
// against hand-computed values of the spec's formulas (../shared/specs/spindlekv.md sections 2 and 3).
#include <vector>

#include <gtest/gtest.h>

#include "cache/compression_policy.h"
#include "cache/policies/spindlekv_budget.h"

namespace strata {
namespace {

// l = 100, l_w = 10, so l_c = 90. r = 0.4: r_c = (40 - 10) / 90 = 1/3, between beta = 0.05 and alpha = 0.525:
// layer 0 keeps 2/3 - 0.05 = 0.61667 (55.5 -> 55), layer 2 keeps 0.05 (4.5 -> 4), layer 1 the mean 1/3 (30).
TEST(SpindleBudget, MiddleRegimeFromTwoRcMinusBetaDownToBeta) {
  const SpindleBudget b{0.4, 10, 0.05, false};
  EXPECT_EQ(spindle_context_keep(0, 3, 100, b), 55);
  EXPECT_EQ(spindle_context_keep(1, 3, 100, b), 30);
  EXPECT_EQ(spindle_context_keep(2, 3, 100, b), 4);
}

// r = 0.8: r_c = 70 / 90 = 0.7778 > alpha. Corrected: layer 0 keeps everything (nullopt), the top layer
// 2 r_c - 1 = 0.5556 (50), the middle one r_c (70): the mean stays r_c. Printed: the top is 1 - 2 r_c < 0 -> 0.
TEST(SpindleBudget, UpperRegimeCorrectedAndPrinted) {
  const SpindleBudget corrected{0.8, 10, 0.05, false};
  EXPECT_EQ(spindle_context_keep(0, 3, 100, corrected), std::nullopt);
  EXPECT_EQ(spindle_context_keep(1, 3, 100, corrected), 70);
  EXPECT_EQ(spindle_context_keep(2, 3, 100, corrected), 50);
  const SpindleBudget printed{0.8, 10, 0.05, true};
  EXPECT_EQ(spindle_context_keep(2, 3, 100, printed), 0);
  EXPECT_EQ(spindle_context_keep(1, 3, 100, printed), 45);  // (1 + 0) / 2 * 90
}

// r l <= l_w: the window only. r_c <= beta: beta in every layer. l <= l_w or r_c >= 1: the whole prompt.
TEST(SpindleBudget, EdgeCases) {
  EXPECT_EQ(spindle_context_keep(0, 3, 100, SpindleBudget{0.1, 10, 0.05, false}), 0);
  const SpindleBudget low{0.12, 10, 0.05, false};  // r_c = 2 / 90
  EXPECT_EQ(spindle_context_keep(0, 3, 100, low), 4);
  EXPECT_EQ(spindle_context_keep(2, 3, 100, low), 4);
  EXPECT_EQ(spindle_context_keep(0, 3, 10, SpindleBudget{0.4, 10, 0.05, false}), std::nullopt);
  EXPECT_EQ(spindle_context_keep(2, 3, 100, SpindleBudget{1.0, 10, 0.05, false}), std::nullopt);
  // One layer keeps r_c itself: 1/3 of 90.
  EXPECT_EQ(spindle_context_keep(0, 1, 100, SpindleBudget{0.4, 10, 0.05, false}), 30);
}

// Two query heads in one KV head, a 6-token prompt, window 2, r = 0.5: r_c = (3 - 2) / 4 = 0.25, one layer, k = 1.
// Window sums of the context tokens: head 0 [0.4 0.1 0.3 0.2], head 1 [0.4 0.1 0.1 0.25]; group mean
// [0.4 0.1 0.2 0.225]. Divided by (l - a) = 6 5 4 3: [0.0667 0.02 0.05 0.075] -> token 3. Plain sums -> token 0.
TEST(SpindleKvPolicy, WindowScoresCausalNormalisationAndCodebookPositions) {
  const std::vector<float> sums = {0.4f, 0.1f, 0.3f, 0.2f, 0.5f, 0.5f, 0.4f, 0.1f, 0.1f, 0.25f, 0.5f, 0.5f};
  LayerState state;
  state.prompt_len = 6;
  state.n_entries = 6;
  state.column_sums = sums.data();
  state.sums_stride = 6;
  PolicyContext context;
  context.n_heads = 2;
  context.n_kv_heads = 1;

  auto causal = make_policy(parse_policy_spec("spindlekv:ratio=0.5,window=2"), context);
  EXPECT_EQ(causal->needs(state).prefill_rows_from, 4);
  const auto selection = causal->on_prefill_end(state);
  ASSERT_TRUE(selection);
  EXPECT_EQ(selection->kept, (std::vector<std::vector<int32_t>>{{3, 4, 5}}));
  ASSERT_TRUE(selection->codebook);
  EXPECT_EQ(selection->codebook->positions, selection->kept);
  EXPECT_FLOAT_EQ(selection->codebook->key_threshold, 0.98f);
  EXPECT_FLOAT_EQ(selection->codebook->value_threshold, 0.95f);

  auto plain = make_policy(parse_policy_spec("spindlekv:ratio=0.5,window=2,normalize=none,codebook=off"), context);
  const auto plain_selection = plain->on_prefill_end(state);
  ASSERT_TRUE(plain_selection);
  EXPECT_EQ(plain_selection->kept, (std::vector<std::vector<int32_t>>{{0, 4, 5}}));
  EXPECT_FALSE(plain_selection->codebook);
}

// A prompt within the window evicts nothing, but the codebook still replaces every entry.
TEST(SpindleKvPolicy, ShortPromptKeepsAllAndStillReplaces) {
  LayerState state;
  state.prompt_len = 2;
  state.n_entries = 2;
  auto policy = make_policy(parse_policy_spec("spindlekv:window=2"), PolicyContext{});
  EXPECT_EQ(policy->needs(state).prefill_rows_from, -1);
  const auto selection = policy->on_prefill_end(state);
  ASSERT_TRUE(selection && selection->codebook);
  EXPECT_EQ(selection->kept, (std::vector<std::vector<int32_t>>{{0, 1}}));
}

TEST(SpindleKvPolicy, BadParametersNameTheParameter) {
  try {
    make_policy(parse_policy_spec("spindlekv:top=sideways"), PolicyContext{});
    FAIL() << "expected a PolicyError";
  } catch (const PolicyError& e) {
    EXPECT_EQ(e.param(), "top");
  }
  try {
    make_policy(parse_policy_spec("spindlekv:ratio=1.5"), PolicyContext{});
    FAIL() << "expected a PolicyError";
  } catch (const PolicyError& e) {
    EXPECT_EQ(e.param(), "ratio");
  }
}

}  // namespace
}  // namespace strata
