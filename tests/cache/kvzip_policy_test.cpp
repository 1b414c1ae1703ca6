// KVzip (cache/policies/kvzip_policy.cpp): what it asks the forward pass for, its selection over the chunks' scores
// against its definition, its scoring rows' tokens and count, and the layers it refuses to share them with.
// Hand-computed cases.
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cache/compression_config.h"
#include "cache/prefill_footprint.h"
#include "cache/scoring_tokens.h"
#include "tests/cache/policy_test_states.h"

namespace strata {
namespace {

using Ids = std::vector<int32_t>;

// 2 query heads over 1 KV head, chunks of 8.
std::unique_ptr<CompressionPolicy> kvzip(const std::string& params, int n_kv_heads = 1) {
  PolicyContext context = test::policy_context(2 * n_kv_heads, n_kv_heads);
  context.prefill_chunk = 8;
  return make_policy(parse_policy_spec("kvzip:" + params), context);
}

// At the compression point `point` with `held` entries before the scoring rows and `rows` of them; maxima
// [n_heads][held + rows].
LayerState at_point(int point, int held, int rows, const std::vector<float>& maxima) {
  LayerState s = test::at(100, held + rows, 0, maxima);
  s.compression_point = point;
  s.scoring_rows = rows;
  return s;
}

TEST(Kvzip, DeclaresWhatItNeeds) {
  auto p = kvzip("budget=6,sinks=2");
  const PolicyTraits t = p->traits();
  EXPECT_TRUE(t.compresses_prefill_chunks && t.reads_column_maxima && t.needs_chunked_prefill);
  EXPECT_FALSE(t.full_precision_pool) << "it reads maxima, never the entries: quantized pools seal as they fill";
  EXPECT_EQ(p->prefill_scoring(100).source, ScoringSource::chunk_reconstruction);
  EXPECT_EQ(p->prefill_budget(100), 6);
  LayerState first = test::start(100);
  first.compression_point = 8;
  const PolicyNeeds needs = p->needs(first);
  EXPECT_EQ(needs.prefill_rows_from, 8) << "the scoring rows, which follow the chunk";
  ASSERT_TRUE(needs.prefill_row_maxima.has_value());
  EXPECT_EQ(needs.prefill_row_maxima->sinks, 2);
  EXPECT_EQ(needs.prefill_row_maxima->from, 0) << "nothing held before the first chunk";
  EXPECT_FALSE(p->needs(test::at(100, 50, 1, {})).prefill_row_maxima) << "nothing asked while decoding";
  EXPECT_THROW(make_policy(parse_policy_spec("kvzip:budget=2,sinks=2"), PolicyContext{}), PolicyError);
}

// Two chunks of 8 with budget 6 (2 sinks): each KV head scores an entry by the max over its query heads, keeps the
// sinks and the top 4 of the rest; the second chunk's maxima cover the sinks and its own entries only, and the
// scores of the entries kept from the first chunk carry over.
TEST(Kvzip, KeepsTheTopOfEveryChunksScoresBesideTheSinks) {
  auto p = kvzip("budget=6,sinks=2");
  // 8 entries, 3 scoring rows (their columns are never scored). Head 0 and head 1; KV head = max of the two.
  const std::vector<float> first = {
      9, 9, 0.1f, 0.5f, 0.2f, 0.1f, 0.4f, 0.3f, 7, 7, 7,   //
      9, 9, 0.3f, 0.1f, 0.1f, 0.6f, 0.1f, 0.1f, 7, 7, 7};  // max: 0.3 0.5 0.2 0.6 0.4 0.3
  std::optional<Selection> keep = p->on_prefill_chunk(at_point(8, 8, 3, first));
  ASSERT_TRUE(keep.has_value());
  EXPECT_EQ(keep->kept[0], (Ids{0, 1, 2, 3, 5, 6})) << "0.5, 0.6, 0.4 and the 0.3 of the lower index (2 before 7)";
  LayerState second = test::start(100);
  second.compression_point = 16;
  EXPECT_EQ(p->needs(second).prefill_row_maxima->from, 6) << "the next chunk's entries follow the 6 held";
  // 6 held + 8 new + 2 scoring rows; the held columns other than the sinks are not the kernel's to touch (0 here).
  std::vector<float> next(2 * 16, 0.0f);
  const std::vector<float> new_scores = {0.05f, 0.7f, 0.1f, 0.35f, 0.2f, 0.1f, 0.1f, 0.45f};
  for (int e = 0; e < 8; ++e) next[size_t(6 + e)] = new_scores[size_t(e)];
  keep = p->on_prefill_chunk(at_point(16, 14, 2, next));
  ASSERT_TRUE(keep.has_value());
  // Held scores: 0.3 (entry 2), 0.5, 0.6, 0.4; new entries 6..13: 0.7 at 7, 0.45 at 13, 0.35 at 9.
  EXPECT_EQ(keep->kept[0], (Ids{0, 1, 3, 4, 7, 13})) << "0.5, 0.6 kept; 0.7 and 0.45 enter; 0.4 and 0.35 leave";
}

TEST(Kvzip, EveryKvHeadKeepsItsOwnEntriesAndAShortChunkIsKeptWhole) {
  auto p = kvzip("budget=3,sinks=1", 2);
  // 4 query heads (2 per KV head), 5 entries and 1 scoring row.
  const std::vector<float> maxima = {
      1, 0.9f, 0.1f, 0.1f, 0.1f, 0,  //
      1, 0.1f, 0.1f, 0.1f, 0.8f, 0,  // KV head 0: 0.9 0.1 0.1 0.8
      1, 0.1f, 0.1f, 0.7f, 0.1f, 0,  //
      1, 0.1f, 0.6f, 0.1f, 0.1f, 0};  // KV head 1: 0.1 0.6 0.7 0.1
  const std::optional<Selection> keep = p->on_prefill_chunk(at_point(8, 5, 1, maxima));
  ASSERT_TRUE(keep.has_value());
  EXPECT_EQ(keep->kept, (std::vector<Ids>{{0, 1, 4}, {0, 2, 3}}));
  auto whole = kvzip("budget=6,sinks=2");
  EXPECT_FALSE(whole->on_prefill_chunk(at_point(8, 5, 1, std::vector<float>(12, 0.5f))).has_value());
  EXPECT_THROW(whole->on_prefill_chunk(at_point(8, 5, 0, std::vector<float>(10, 0.5f))), std::logic_error)
      << "a point without its scoring rows";
}

TEST(Kvzip, AFractionResolvesAgainstThePointAndTheEntriesAfterItFollow) {
  auto p = kvzip("budget=0.5,sinks=2");
  EXPECT_EQ(p->entries_after_point(8), 4);
  EXPECT_EQ(p->entries_after_point(16), 8) << "min(4 + 8, 8)";
  EXPECT_EQ(p->entries_after_point(24), 12);
  EXPECT_FALSE(p->entries_after_point(20).has_value()) << "not a compression point";
}

// instruction + the chunk's first min(8, chunk) tokens + answer start + the chunk before the point.
TEST(Kvzip, ScoringTokensRepeatTheChunkBeforeThePoint) {
  CompressionConfig c;
  c.policy = parse_policy_spec("kvzip:budget=8");
  c.prefill_chunk = 10;
  c.reconstruction = {{901, 902}, {903}};
  std::vector<int32_t> prompt(35);
  for (int i = 0; i < 35; ++i) prompt[size_t(i)] = i;
  const ScoringRows rows = prefill_scoring_rows(c, std::nullopt, test::policy_context(2, 1, 0, 3), 35);
  EXPECT_EQ(rows.source, ScoringSource::chunk_reconstruction);
  EXPECT_EQ(rows.count, 2 + 8 + 1 + 10);
  EXPECT_EQ(scoring_tokens(rows, c, prompt, 20),
            (Ids{901, 902, 10, 11, 12, 13, 14, 15, 16, 17, 903, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19}));
  EXPECT_THROW(scoring_tokens(rows, c, prompt, 25), std::logic_error) << "not a compression point";
  c.prefill_chunk = 4;
  EXPECT_EQ(reconstruction_rows(c.reconstruction, 4), 2 + 4 + 1 + 4) << "a chunk shorter than 8 names itself whole";
  const ScoringRows tail{ScoringSource::prompt_tail, 3};
  EXPECT_EQ(scoring_tokens(tail, c, prompt, 8), (Ids{32, 33, 34}));
}

// Every layer reconstructs or keeps everything: another policy's layer would read the rows too.
TEST(Kvzip, RunsInEveryLayerThatCompressesOrNone) {
  CompressionConfig c;
  c.policy = parse_policy_spec("kvzip:budget=8");
  c.prefill_chunk = 16;
  const PolicyContext context = test::policy_context(2, 1, 0, 3);
  c.overrides = parse_layer_overrides("0=full");
  EXPECT_EQ(prefill_scoring_rows(c, std::nullopt, context, 100).source, ScoringSource::chunk_reconstruction);
  for (const std::string other : {"1=snapkv:budget=12,window=4", "1=streaming:budget=8", "2=h2o:budget=16"}) {
    c.overrides = parse_layer_overrides(other);
    EXPECT_THROW(prefill_scoring_rows(c, std::nullopt, context, 100), std::invalid_argument) << other;
  }
  EXPECT_EQ(prefill_scoring_rows(c, parse_policy_spec("kvzip:budget=8"), context, 100).source,
            ScoringSource::chunk_reconstruction)
      << "a request's policy replaces every layer's";
  c.prefill_chunk = 0;
  EXPECT_EQ(prefill_scoring_rows(c, std::nullopt, context, 100).count, 0) << "end mode";
}

}  // namespace
}  // namespace strata
