// What prefix caching may reuse under each policy (cache/prefix_reuse.h): everything but the last prompt token with
// `full`, up to the observation window with SnapKV and PyramidKV (and everything when the prompt fits the budget),
// nothing with H2O's accumulated scores, nothing and no publishing with PoD; per-layer overrides count.
#include "cache/prefix_reuse.h"

#include <gtest/gtest.h>

namespace strata {
namespace {

PrefixReuse reuse_of(const std::string& policy, int prompt_len, std::vector<LayerOverride> overrides = {}) {
  PolicyContext context;
  context.n_layers_total = 6;
  context.n_heads = 4;
  context.n_kv_heads = 2;
  context.model_name = "SmolLM2-135M-Instruct";
  return prefix_reuse(CompressionConfig{parse_policy_spec(policy), std::move(overrides)}, std::nullopt, context,
                      prompt_len);
}

TEST(PrefixReuse, FullReusesAllButTheLastPromptToken) {
  const PrefixReuse r = reuse_of("full", 100);
  EXPECT_EQ(r.max_cached_tokens, 99);
  EXPECT_TRUE(r.may_publish);
  EXPECT_EQ(reuse_of("full", 1).max_cached_tokens, 0);
}

TEST(PrefixReuse, ObservationWindowsAreComputed) {
  EXPECT_EQ(reuse_of("snapkv:budget=16,window=8", 100).max_cached_tokens, 92);
  EXPECT_EQ(reuse_of("snapkv:budget=200,window=8", 100).max_cached_tokens, 99) << "the prompt fits: no selection";
  EXPECT_EQ(reuse_of("pyramidkv:budget=16,window=8", 100).max_cached_tokens, 92);
  EXPECT_EQ(reuse_of("full", 100, {{3, 3, parse_policy_spec("snapkv:budget=16,window=8")}}).max_cached_tokens, 92);
}

TEST(PrefixReuse, AccumulatedScoresNeedEveryPromptRow) {
  EXPECT_EQ(reuse_of("h2o:budget=16", 100).max_cached_tokens, 0);
}

TEST(PrefixReuse, PodNeitherReusesNorPublishes) {
  const PrefixReuse r = reuse_of("pod", 100);
  EXPECT_EQ(r.max_cached_tokens, 0);
  EXPECT_FALSE(r.may_publish);
}

TEST(PrefixReuse, TheRequestsPolicyWinsOverTheConfiguration) {
  PolicyContext context;
  context.n_layers_total = 2;
  const CompressionConfig config{parse_policy_spec("full"), {}};
  EXPECT_EQ(prefix_reuse(config, parse_policy_spec("h2o:budget=16"), context, 100).max_cached_tokens, 0);
}

}  // namespace
}  // namespace strata
