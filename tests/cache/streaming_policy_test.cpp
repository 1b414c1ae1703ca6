#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cache/policies/policies.h"

namespace strata {
namespace {

using Ids = std::vector<int32_t>;

std::unique_ptr<CompressionPolicy> streaming(const std::string& params) {
  return make_streaming_policy(parse_policy_spec("streaming" + (params.empty() ? "" : ":" + params)), {});
}

LayerState at(int prompt_len, int n_entries, int n_generated) {
  LayerState s;
  s.prompt_len = prompt_len;
  s.n_entries = n_entries;
  s.n_generated = n_generated;
  return s;
}

Ids range(int from, int to) {
  Ids ids;
  for (int j = from; j < to; ++j) ids.push_back(j);
  return ids;
}

Ids concat(Ids a, const Ids& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Applies a selection to the original positions a layer holds, as the cache's compaction does.
void apply(std::vector<int>& positions, const Selection& sel) {
  ASSERT_EQ(sel.kept.size(), 1u);
  std::vector<int> next;
  for (int32_t e : sel.kept[0]) next.push_back(positions[e]);
  positions = next;
}

TEST(StreamingPolicy, DefaultsKeepFourSinksAndTheLast124) {
  auto p = streaming("");
  EXPECT_EQ(p->name(), "streaming");
  const std::optional<Selection> sel = p->on_prefill_end(at(200, 200, 0));
  ASSERT_TRUE(sel.has_value());
  ASSERT_EQ(sel->kept.size(), 1u);  // one list for every KV head
  EXPECT_EQ(sel->kept[0], concat(range(0, 4), range(76, 200)));
  const std::optional<Selection> one_over = p->on_prefill_end(at(129, 129, 0));
  ASSERT_TRUE(one_over.has_value());
  EXPECT_EQ(one_over->kept[0], concat(range(0, 4), range(5, 129)));
}

TEST(StreamingPolicy, PromptsUpToTheBudgetKeepEverything) {
  auto p = streaming("budget=6,sinks=2");
  EXPECT_FALSE(p->on_prefill_end(at(6, 6, 0)).has_value());
  EXPECT_FALSE(p->on_prefill_end(at(1, 1, 0)).has_value());
  EXPECT_FALSE(streaming("budget=1000")->on_prefill_end(at(200, 200, 0)).has_value());
}

TEST(StreamingPolicy, NeedsNoStatistics) {
  auto p = streaming("mode=rolling");
  for (int generated : {0, 1, 5}) {
    const PolicyNeeds n = p->needs(at(100, 100 + generated, generated));
    EXPECT_EQ(n.prefill_rows_from, -1);
    EXPECT_FALSE(n.decode_probabilities);
  }
}

TEST(StreamingPolicy, OneShotCutsOnceAndThenGrows) {
  auto p = streaming("budget=6,sinks=2");
  const std::optional<Selection> sel = p->on_prefill_end(at(10, 10, 0));
  ASSERT_TRUE(sel.has_value());
  EXPECT_EQ(sel->kept[0], (Ids{0, 1, 6, 7, 8, 9}));
  for (int step = 1; step <= 4; ++step) EXPECT_FALSE(p->on_decode_step(at(10, 6 + step, step)).has_value());
}

TEST(StreamingPolicy, RollingKeepsTheSinksAndTheMostRecentAfterEveryStep) {
  auto p = streaming("budget=5,sinks=2,mode=rolling");
  std::vector<int> positions = {0, 1, 2, 3, 4, 5, 6};
  const std::optional<Selection> pre = p->on_prefill_end(at(7, 7, 0));
  ASSERT_TRUE(pre.has_value());
  EXPECT_EQ(pre->kept[0], (Ids{0, 1, 4, 5, 6}));
  apply(positions, *pre);
  for (int step = 1; step <= 3; ++step) {
    positions.push_back(6 + step);  // the step's token arrives at the end
    const std::optional<Selection> sel = p->on_decode_step(at(7, int(positions.size()), step));
    ASSERT_TRUE(sel.has_value()) << "step " << step;
    EXPECT_EQ(sel->kept[0], (Ids{0, 1, 3, 4, 5})) << "step " << step;
    apply(positions, *sel);
    EXPECT_EQ(positions, (std::vector<int>{0, 1, 4 + step, 5 + step, 6 + step})) << "step " << step;
  }
}

TEST(StreamingPolicy, RollingAfterAShortPromptWaitsUntilTheBudgetIsExceeded) {
  auto p = streaming("budget=5,sinks=2,mode=rolling");
  EXPECT_FALSE(p->on_prefill_end(at(3, 3, 0)).has_value());
  EXPECT_FALSE(p->on_decode_step(at(3, 4, 1)).has_value());
  EXPECT_FALSE(p->on_decode_step(at(3, 5, 2)).has_value());
  const std::optional<Selection> sel = p->on_decode_step(at(3, 6, 3));
  ASSERT_TRUE(sel.has_value());
  EXPECT_EQ(sel->kept[0], (Ids{0, 1, 3, 4, 5}));
}

TEST(StreamingPolicy, RollingOnAQuantizedPoolCutsAGroupsWorthAtOnce) {
  // decode_eviction_batch 32 (a quantized pool): the prompt is cut to the budget exactly, then the layer grows to
  // 31 past it and the 32nd step cuts 32 entries back to the budget, all of them just after the sinks.
  PolicyContext context;
  context.decode_eviction_batch = 32;
  auto p = make_streaming_policy(parse_policy_spec("streaming:budget=40,sinks=4,mode=rolling"), context);
  const std::optional<Selection> pre = p->on_prefill_end(at(100, 100, 0));
  ASSERT_TRUE(pre.has_value());
  EXPECT_EQ(pre->kept[0], concat(range(0, 4), range(64, 100)));
  for (int step = 1; step < 32; ++step) {
    EXPECT_FALSE(p->on_decode_step(at(100, 40 + step, step)).has_value()) << "step " << step;
  }
  const std::optional<Selection> cut = p->on_decode_step(at(100, 72, 32));
  ASSERT_TRUE(cut.has_value());
  EXPECT_EQ(cut->kept[0], concat(range(0, 4), range(36, 72)));
}

TEST(StreamingPolicy, ZeroSinksIsAPlainRecentWindow) {
  const std::optional<Selection> sel = streaming("budget=3,sinks=0")->on_prefill_end(at(8, 8, 0));
  ASSERT_TRUE(sel.has_value());
  EXPECT_EQ(sel->kept[0], (Ids{5, 6, 7}));
}

TEST(StreamingPolicy, FractionBudgetsResolveAgainstThePrompt) {
  // 50% of 10 = 5: 2 sinks + 3 recent, and rolling holds 5 while decoding.
  auto p = streaming("budget=50%,sinks=2,mode=rolling");
  const std::optional<Selection> sel = p->on_prefill_end(at(10, 10, 0));
  ASSERT_TRUE(sel.has_value());
  EXPECT_EQ(sel->kept[0], (Ids{0, 1, 7, 8, 9}));
  const std::optional<Selection> step = p->on_decode_step(at(10, 6, 1));
  ASSERT_TRUE(step.has_value());
  EXPECT_EQ(step->kept[0], (Ids{0, 1, 3, 4, 5}));
  // 10% of 20 = 2 < 4 sinks: the sinks alone.
  const std::optional<Selection> tiny = streaming("budget=10%")->on_prefill_end(at(20, 20, 0));
  ASSERT_TRUE(tiny.has_value());
  EXPECT_EQ(tiny->kept[0], (Ids{0, 1, 2, 3}));
}

TEST(StreamingPolicy, ParameterErrorsNameTheParameter) {
  const std::pair<std::string, std::string> cases[] = {
      {"budget=4", "budget"},          // C <= sinks (4 by default)
      {"budget=3,sinks=3", "budget"},  //
      {"budget=0", "budget"},          //
      {"sinks=-1", "sinks"},           //
      {"mode=paper", "mode"},          //
      {"window=8", "window"},          // streaming has no window parameter
  };
  for (const auto& [params, param] : cases) {
    try {
      streaming(params);
      ADD_FAILURE() << params << " was accepted";
    } catch (const PolicyError& e) {
      EXPECT_EQ(e.param(), param) << params << ": " << e.what();
    }
  }
  EXPECT_NO_THROW(streaming("budget=5,sinks=4,mode=rolling"));
}

}  // namespace
}  // namespace strata
