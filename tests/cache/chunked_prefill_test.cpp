// Chunked prefill compression (kv_cache.prefill_compression chunked) in the cache layer: each policy's chunked
// form against its documented definition, the budgets that bound a layer between chunks, the peak the scheduler
// admits by, and what prefix caching may share. Hand-computed cases.
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cache/compression_config.h"
#include "cache/policies/policies.h"
#include "cache/policies/selection.h"
#include "cache/prefill_footprint.h"
#include "cache/prefix_reuse.h"
#include "tests/cache/policy_test_states.h"

namespace strata {
namespace {

using Ids = std::vector<int32_t>;

std::unique_ptr<CompressionPolicy> policy(const std::string& spec, int layer = 0, int n_layers = 1) {
  return make_policy(parse_policy_spec(spec), test::policy_context(1, 1, layer, n_layers));
}

CompressionConfig chunked(const std::string& spec, int chunk) {
  CompressionConfig c;
  c.policy = parse_policy_spec(spec);
  c.prefill_chunk = chunk;
  return c;
}

TEST(ChunkedPrefill, CompressionPointsAreMultiplesOfTheChunkThenThePromptsEnd) {
  const CompressionConfig c = chunked("full", 8);
  EXPECT_EQ(c.compression_point(0, 20), 8);
  EXPECT_EQ(c.compression_point(7, 20), 8);
  EXPECT_EQ(c.compression_point(8, 20), 16);
  EXPECT_EQ(c.compression_point(16, 20), 20);
  EXPECT_EQ(CompressionConfig{}.compression_point(3, 20), 20) << "end mode: the prompt's end only";
}

TEST(ChunkedPrefill, PoliciesWithAChunkedFormSayWhichTheyAre) {
  for (const std::string name : {"full", "streaming", "h2o", "snapkv", "pyramidkv"}) {
    EXPECT_TRUE(policy(name)->traits().compresses_prefill_chunks) << name;
  }
  for (const std::string name : {"simlayerkv", "d2o", "spindlekv"}) {
    EXPECT_FALSE(policy(name)->traits().compresses_prefill_chunks) << name;
    EXPECT_THROW(policy(name)->on_prefill_chunk(test::at(100, 50, 0, {})), std::logic_error) << name;
  }
}

// StreamingLLM's cut after every chunk ends with the positions the one-shot cut keeps: the sinks and the last
// C - sinks of the whole prompt. Positions are followed through the renumbering of every compaction.
TEST(ChunkedPrefill, StreamingChunksKeepWhatTheOneShotCutKeeps) {
  auto p = policy("streaming:budget=6,sinks=2");
  EXPECT_EQ(p->prefill_budget(1000), 6);
  std::vector<int> positions;  // of the layer's entries
  int next = 0;
  for (int end : {8, 12, 16, 19}) {
    while (next < end) positions.push_back(next++);
    const int n = int(positions.size());
    const std::optional<Selection> keep =
        end == 19 ? p->on_prefill_end(test::at(19, n, 0, {})) : p->on_prefill_chunk(test::at(19, n, 0, {}));
    ASSERT_TRUE(keep.has_value()) << "at " << end;
    std::vector<int> kept;
    for (int32_t e : keep->kept[0]) kept.push_back(positions[size_t(e)]);
    positions = kept;
    EXPECT_LE(int(positions.size()), 6);
  }
  EXPECT_EQ(positions, (std::vector<int>{0, 1, 15, 16, 17, 18}));
}

TEST(ChunkedPrefill, H2oCutsByTheAttentionAccumulatedSoFar) {
  // C = 4 with a window of 1: the top 3 of the 5 scored entries by accumulated sums, plus the newest.
  auto p = policy("h2o:budget=4,window=1");
  EXPECT_EQ(p->prefill_budget(100), 4);
  EXPECT_EQ(p->needs(test::start(100)).prefill_rows_from, 0) << "every prompt row, across chunks";
  const std::vector<float> sums = {5, 1, 3, 0, 2, 9};
  const std::optional<Selection> keep = p->on_prefill_chunk(test::at(100, 6, 0, sums));
  ASSERT_TRUE(keep.has_value());
  EXPECT_EQ(keep->kept[0], (Ids{0, 2, 4, 5}));
  EXPECT_FALSE(p->on_prefill_chunk(test::at(100, 4, 0, {})).has_value()) << "within the budget: nothing to cut";
}

TEST(ChunkedPrefill, SnapKvTakesTheChunksLastQueriesAsItsWindow) {
  auto p = policy("snapkv:budget=5,window=2,kernel=1");
  EXPECT_EQ(p->prefill_budget(100), 5);
  LayerState at_point = test::start(100);
  at_point.compression_point = 16;
  EXPECT_EQ(p->needs(at_point).prefill_rows_from, 14) << "the window ends at the compression point";
  EXPECT_EQ(p->needs(test::start(100)).prefill_rows_from, 98) << "and at the prompt's end without one";
  // 8 scored entries and the window's 2: the top 3 (1, 5, 7), then the window.
  const std::vector<float> sums = {0, 6, 0, 0, 0, 5, 0, 4, 100, 100};
  const std::optional<Selection> keep = p->on_prefill_chunk(test::at(100, 10, 0, sums));
  ASSERT_TRUE(keep.has_value());
  EXPECT_EQ(keep->kept[0], (Ids{1, 5, 7, 8, 9}));
  EXPECT_FALSE(p->on_prefill_chunk(test::at(100, 5, 0, {})).has_value());
}

// FINCH's form: the prompt's last w tokens run after the chunk (the scoring rows, here 2 or 4 of them), and the
// last w of those are the window whose sums score the entries before them.
TEST(ChunkedPrefill, SnapKvScoresAChunkByThePromptsLastQueriesRunAfterIt) {
  auto p = policy("snapkv:budget=5,window=2,kernel=1");
  EXPECT_EQ(p->prefill_scoring(100).count, 2);
  EXPECT_EQ(p->prefill_scoring(4).count, 0) << "a prompt within the budget is never cut";
  LayerState at_point = test::start(100);
  at_point.compression_point = 16;
  at_point.scoring_rows = 2;
  EXPECT_EQ(p->needs(at_point).prefill_rows_from, 16) << "the scoring rows start at the point";
  at_point.scoring_rows = 4;
  EXPECT_EQ(p->needs(at_point).prefill_rows_from, 18) << "the last 2 of 4 (another layer's window is 4)";
  LayerState at_end = test::start(100);
  at_end.scoring_rows = 2;
  EXPECT_EQ(p->needs(at_end).prefill_rows_from, 98) << "the prompt's end has its own last rows";
  // 10 entries held and the 2 scoring rows' entries (their own columns weigh nothing): the top 3 of the 8 scored
  // (1, 5, 7), then the chunk's last 2.
  const std::vector<float> sums = {0, 6, 0, 0, 0, 5, 0, 4, 100, 100, 1000, 1000};
  LayerState state = test::at(100, 12, 0, sums);
  state.compression_point = 16;
  state.scoring_rows = 2;
  const std::optional<Selection> keep = p->on_prefill_chunk(state);
  ASSERT_TRUE(keep.has_value());
  EXPECT_EQ(keep->kept[0], (Ids{1, 5, 7, 8, 9}));
  state.n_entries = 7;
  EXPECT_FALSE(p->on_prefill_chunk(state).has_value()) << "5 held besides the scoring rows: within the budget";
}

// The scoring rows are the longest window any layer asks for, and none where a layer sums other prompt rows (H2O's
// every row, Expected Attention's moments) that they would join, or the prompt is never cut.
TEST(ChunkedPrefill, ScoringRowsAreTheLongestWindowUnlessALayerSumsOtherRows) {
  const PolicyContext context = test::policy_context(1, 1, 0, 3);
  CompressionConfig c = chunked("snapkv:budget=32,window=8", 64);
  EXPECT_EQ(prefill_scoring_rows(c, std::nullopt, context, 1000).count, 8);
  c.overrides = parse_layer_overrides("0=full;2=pyramidkv:budget=48,window=16");
  EXPECT_EQ(prefill_scoring_rows(c, std::nullopt, context, 1000).count, 16);
  EXPECT_EQ(prefill_scoring_rows(c, std::nullopt, context, 20).count, 0) << "no layer cuts a prompt of 20";
  c.overrides = parse_layer_overrides("0=h2o:budget=32");
  EXPECT_EQ(prefill_scoring_rows(c, std::nullopt, context, 1000).count, 0);
  EXPECT_EQ(prefill_scoring_rows(c, parse_policy_spec("streaming:budget=10"), context, 1000).count, 0);
  EXPECT_EQ(prefill_scoring_rows(c, parse_policy_spec("expected_attention:budget=32"), context, 1000).count, 0);
  c.overrides.clear();
  c.prefill_chunk = 0;
  EXPECT_EQ(prefill_scoring_rows(c, std::nullopt, context, 1000).count, 0) << "end mode";
}

TEST(ChunkedPrefill, PyramidKvBoundsEachLayerByItsOwnBudget) {
  const int n_layers = 4, prompt = 1000;
  const std::vector<int> k = *pyramid_budgets_official(n_layers, prompt, 64, 8, 20);
  for (int l = 0; l < n_layers; ++l) {
    EXPECT_EQ(policy("pyramidkv:budget=64", l, n_layers)->prefill_budget(prompt), k[size_t(l)] + 8) << "layer " << l;
  }
}

TEST(ChunkedPrefill, PeakEntriesAreTheBudgetPlusAChunkAndTheScoringRowsInEveryBoundedLayer) {
  PolicyContext context = test::policy_context(1, 1, 0, 3);
  CompressionConfig c = chunked("snapkv:budget=32,window=8", 64);
  c.overrides = parse_layer_overrides("0=full");
  // The bounded layers: 32 kept, a chunk of 64 and the 8 scoring rows.
  EXPECT_EQ(prefill_peak_entries(c, std::nullopt, context, 1000), (std::vector<int>{1001, 104, 104}));
  EXPECT_EQ(prefill_peak_entries(c, std::nullopt, context, 50), (std::vector<int>{51, 51, 51}));
  EXPECT_EQ(prefill_peak_entries(c, std::nullopt, context, 961), (std::vector<int>{968, 104, 104}))
      << "the whole prompt's layer holds 960 and the scoring rows at the last point";
  EXPECT_EQ(prefill_peak_entries(c, parse_policy_spec("streaming:budget=10"), context, 1000),
            (std::vector<int>{74, 74, 74}))
      << "a request's policy replaces every layer's";
  c.prefill_chunk = 0;
  EXPECT_EQ(prefill_peak_entries(c, std::nullopt, context, 1000), (std::vector<int>{1001, 1001, 1001}))
      << "end mode: the whole prompt";
}

TEST(ChunkedPrefill, PrefixCachingSharesOnlyWhatPrecedesTheFirstCompression) {
  const PolicyContext context = test::policy_context(1, 1, 0, 2);
  const PrefixReuse streaming = prefix_reuse(chunked("streaming", 64), std::nullopt, context, 1000);
  EXPECT_EQ(streaming.max_cached_tokens, 63);
  EXPECT_EQ(streaming.max_published_tokens, 64);
  EXPECT_EQ(prefix_reuse(chunked("snapkv:window=32", 64), std::nullopt, context, 1000).max_cached_tokens, 32);
  const PrefixReuse full = prefix_reuse(chunked("full", 64), std::nullopt, context, 1000);
  EXPECT_EQ(full.max_cached_tokens, 999);
  EXPECT_EQ(full.max_published_tokens, std::numeric_limits<int>::max());
  const PrefixReuse short_prompt = prefix_reuse(chunked("streaming", 64), std::nullopt, context, 40);
  EXPECT_EQ(short_prompt.max_cached_tokens, 39) << "a prompt within one chunk is compressed at its end only";
}

// kv_cache.prefill_compression auto: chunked for a sequence whose policies all have the chunked form and compress,
// end for the others; the footprint and what the prefix cache may share follow the sequence's own mode.
CompressionConfig automatic(const std::string& spec, int chunk) {
  CompressionConfig c = chunked(spec, chunk);
  c.chunked_where_possible = true;
  return c;
}

TEST(ChunkedPrefill, AutoChunksWhereEveryPolicyHasTheFormAndOneCompresses) {
  const PolicyContext context = test::policy_context(1, 1, 0, 3);
  CompressionConfig c = automatic("snapkv:budget=48,window=8", 64);
  EXPECT_THROW(c.chunked(), std::logic_error) << "auto is decided per sequence";
  EXPECT_EQ(c.for_sequence(std::nullopt, context).prefill_chunk, 64);
  EXPECT_FALSE(c.for_sequence(std::nullopt, context).chunked_where_possible);
  for (const std::string name : {"streaming", "h2o", "pyramidkv", "expected_attention", "kvzip"}) {
    EXPECT_TRUE(c.for_sequence(parse_policy_spec(name), context).chunked()) << name;
  }
  for (const std::string name : {"simlayerkv", "d2o", "spindlekv", "full"}) {
    EXPECT_FALSE(c.for_sequence(parse_policy_spec(name), context).chunked()) << name;
  }
  c.overrides = parse_layer_overrides("0=full");
  EXPECT_TRUE(c.for_sequence(std::nullopt, context).chunked()) << "full in one layer, SnapKV in the others";
  c.overrides = parse_layer_overrides("0=simlayerkv");
  EXPECT_FALSE(c.for_sequence(std::nullopt, context).chunked()) << "one layer without the form: end";
  c.policy = parse_policy_spec("kvzip");
  try {
    c.for_sequence(std::nullopt, context);
    ADD_FAILURE() << "KVzip (chunks only) beside SimLayerKV (no chunked form) cannot be decided";
  } catch (const std::invalid_argument& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("kvzip (layer 2)"), std::string::npos) << message;
    EXPECT_NE(message.find("simlayerkv (layer 0)"), std::string::npos) << message;
  }
  EXPECT_EQ(chunked("simlayerkv", 64).for_sequence(std::nullopt, context).prefill_chunk, 64)
      << "chunked is not auto: the configuration stays as it is (and the rank refuses the policy)";
}

TEST(ChunkedPrefill, AutoCountsEachSequencesPeakAndReuseByItsOwnMode) {
  const PolicyContext context = test::policy_context(1, 1, 0, 2);
  const CompressionConfig c = automatic("streaming:budget=16", 64);
  EXPECT_EQ(prefill_peak_entries(c, std::nullopt, context, 1000), (std::vector<int>{80, 80})) << "16 and a chunk";
  EXPECT_EQ(prefill_peak_entries(c, parse_policy_spec("simlayerkv"), context, 1000), (std::vector<int>{1001, 1001}))
      << "a request's policy without the chunked form holds its whole prompt";
  EXPECT_EQ(prefix_reuse(c, std::nullopt, context, 1000).max_cached_tokens, 63);
  EXPECT_EQ(prefix_reuse(c, parse_policy_spec("full"), context, 1000).max_cached_tokens, 999);
  EXPECT_EQ(prefill_scoring_rows(automatic("snapkv:window=8", 64), std::nullopt, context, 1000).count, 8);
  EXPECT_EQ(prefill_scoring_rows(automatic("snapkv:window=8", 64), parse_policy_spec("d2o"), context, 1000).count, 0);
}

}  // namespace
}  // namespace strata
