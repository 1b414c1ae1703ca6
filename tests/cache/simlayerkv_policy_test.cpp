// SimLayerKV (specs/simlayerkv.md) on hand-computed attention sums. Most cases use n_init = 2 and window = 4, so
// that a 10-entry layer keeps S = {0, 1} ∪ {6, 7, 8, 9}; the masses are sums of powers of two, so the scores are
// exact and can sit exactly on the threshold.
#include <cstdint>
#include <map>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cache/compression_policy.h"
#include "cache/policies/policies.h"
#include "cache/policies/simlayerkv_score.h"
#include "cache/policy_spec.h"
#include "tests/observed.h"

namespace strata {
namespace {

using Params = std::map<std::string, std::string>;

// Column sums [n_heads][stride] for a layer of n_entries; the stride is wider than the layer and its padding holds
// large values, so reading past n_entries or with the wrong stride changes the verdicts below.
class Sums {
 public:
  Sums(int n_heads, int n_entries)
      : n_entries_(n_entries), stride_(n_entries + 3), data_(size_t(n_heads) * stride_, 0.0f) {
    for (int h = 0; h < n_heads; ++h) {
      for (int e = n_entries; e < stride_; ++e) data_[size_t(h) * stride_ + e] = 100.0f;
    }
  }
  Sums& set(int head, int entry, float value) {
    data_[size_t(head) * stride_ + entry] = value;
    return *this;
  }
  LayerState state(int prompt_len, int n_generated) const {
    LayerState s;
    s.prompt_len = prompt_len;
    s.n_entries = n_entries_;
    s.n_generated = n_generated;
    s.column_sums = data_.data();
    s.sums_stride = stride_;
    return s;
  }

 private:
  int n_entries_;
  int stride_;
  std::vector<float> data_;
};

LayerState bare_state(int prompt_len, int n_entries, int n_generated) {
  LayerState s;
  s.prompt_len = prompt_len;
  s.n_entries = n_entries;
  s.n_generated = n_generated;
  return s;
}

std::unique_ptr<CompressionPolicy> make(const Params& params, int n_heads = 2, int n_kv_heads = 1,
                                        const std::string& model = "test-model") {
  PolicySpec spec;
  spec.name = "simlayerkv";
  spec.params = params;
  PolicyContext context;
  context.global_layer = 3;
  context.n_layers_total = 8;
  context.n_heads = n_heads;
  context.n_kv_heads = n_kv_heads;
  context.model_name = model;
  return make_simlayerkv_policy(spec, context);
}

// The small configuration most cases use.
Params small(Params extra = {}) {
  Params p = {{"n_init", "2"}, {"window", "4"}, {"threshold", "0.75"}};
  p.insert(extra.begin(), extra.end());
  return p;
}

std::vector<int32_t> ascending(int begin, int end) {
  std::vector<int32_t> v(end - begin);
  std::iota(v.begin(), v.end(), begin);
  return v;
}

std::vector<int32_t> join(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The first decode step of a 9-token prompt: 10 entries, head masses on S of `mass0` and `mass1`, each split over
// the first initial entry and the newest entry, plus mass outside S (entries 2 and 5, just inside each boundary).
Sums first_step_sums(float mass0, float mass1) {
  Sums sums(2, 10);
  sums.set(0, 0, mass0 / 2).set(0, 9, mass0 / 2).set(0, 2, 1 - mass0);
  sums.set(1, 1, mass1 / 2).set(1, 6, mass1 / 2).set(1, 5, 1 - mass1);
  return sums;
}

const std::vector<int32_t> kSmallKept = {0, 1, 6, 7, 8, 9};

TEST(SimLayerKvPolicy, DecodeStrategyAsksForTheFirstDecodeQueryOnly) {
  auto p = make(small());
  EXPECT_EQ(p->name(), "simlayerkv");
  const PolicyNeeds at_start = p->needs(bare_state(9, 0, 0));
  EXPECT_EQ(at_start.prefill_rows_from, -1);
  EXPECT_FALSE(at_start.decode_probabilities);
  EXPECT_FALSE(p->on_prefill_end(bare_state(9, 9, 0)).has_value());
  EXPECT_FALSE(test::verdict(*p, "lazy").has_value());  // nothing decided at prefill end under the decode strategy
  const PolicyNeeds before_first = p->needs(bare_state(9, 9, 0));
  EXPECT_EQ(before_first.prefill_rows_from, -1);
  EXPECT_TRUE(before_first.decode_probabilities);
  p->on_decode_step(first_step_sums(1.0f, 1.0f).state(9, 1));
  const PolicyNeeds after = p->needs(bare_state(9, 6, 1));
  EXPECT_EQ(after.prefill_rows_from, -1);
  EXPECT_FALSE(after.decode_probabilities);
}

TEST(SimLayerKvPolicy, LazyAboveTheThresholdKeepsTheInitialAndRecentEntries) {
  auto p = make(small());
  // Mean of 0.875 and 0.75 = 0.8125 > 0.75.
  const auto sel = p->on_decode_step(first_step_sums(0.875f, 0.75f).state(9, 1));
  ASSERT_TRUE(sel.has_value());
  ASSERT_EQ(sel->kept.size(), 1u);  // one list: every KV head keeps the same entries
  EXPECT_EQ(sel->kept[0], kSmallKept);
  ASSERT_TRUE(test::verdict(*p, "lazy").has_value());
  EXPECT_TRUE(*test::verdict(*p, "lazy"));
}

TEST(SimLayerKvPolicy, NotLazyBelowTheThreshold) {
  auto p = make(small());
  // Mean of 0.75 and 0.625 = 0.6875 <= 0.75; the mass on entries 2 and 5 lies outside S.
  EXPECT_FALSE(p->on_decode_step(first_step_sums(0.75f, 0.625f).state(9, 1)).has_value());
  ASSERT_TRUE(test::verdict(*p, "lazy").has_value());
  EXPECT_FALSE(*test::verdict(*p, "lazy"));
}

TEST(SimLayerKvPolicy, ExactlyAtTheThresholdDependsOnTheComparison) {
  // Mean of 1.0 and 0.5 = 0.75 exactly. Code: score > δ (the default); paper: score >= δ (spec D1).
  for (const Params& params : {small(), small({{"compare", "code"}})}) {
    auto p = make(params);
    EXPECT_FALSE(p->on_decode_step(first_step_sums(1.0f, 0.5f).state(9, 1)).has_value());
    EXPECT_FALSE(*test::verdict(*p, "lazy"));
  }
  auto paper = make(small({{"compare", "paper"}}));
  const auto sel = paper->on_decode_step(first_step_sums(1.0f, 0.5f).state(9, 1));
  ASSERT_TRUE(sel.has_value());
  EXPECT_EQ(sel->kept[0], kSmallKept);
  EXPECT_TRUE(*test::verdict(*paper, "lazy"));
}

TEST(SimLayerKvPolicy, OnlyTheEntriesOfSCount) {
  // All of head 0's mass just outside the initial set (entry 2), all of head 1's just outside the recent window
  // (entry 5): score 0, whatever the threshold.
  auto p = make(small({{"threshold", "0"}}));
  Sums sums(2, 10);
  sums.set(0, 2, 1.0f).set(1, 5, 1.0f);
  EXPECT_FALSE(p->on_decode_step(sums.state(9, 1)).has_value());
  EXPECT_FALSE(*test::verdict(*p, "lazy"));
  // The same layer with the mass one entry further in each direction (entries 1 and 6): score 1.
  auto q = make(small({{"threshold", "0"}}));
  Sums inside(2, 10);
  inside.set(0, 1, 1.0f).set(1, 6, 1.0f);
  EXPECT_TRUE(q->on_decode_step(inside.state(9, 1)).has_value());
}

TEST(SimLayerKvScore, UnionCountsAnEntryOnceWhenTheSetsOverlap) {
  // n = 10 with n_init = 4 and window = 1024: the recent window covers the initial tokens. A probability
  // distribution scores 1, not the official code's 1 + mass on [0, 4) (spec D6).
  Sums sums(1, 10);
  for (int e = 0; e < 10; ++e) sums.set(0, e, e < 4 ? 0.125f : 0.5f / 6);
  EXPECT_NEAR(simlayerkv_score(simlayerkv_score_part(sums.state(9, 1), 1, 1, 4, 1024)), 1.0, 1e-6);
  // Overlap by one entry: n = 7, n_init = 4, window = 4 gives S = [0, 4) ∪ [3, 7) = everything.
  Sums seven(1, 7);
  for (int e = 0; e < 7; ++e) seven.set(0, e, 0.125f);
  seven.set(0, 3, 0.25f);
  EXPECT_DOUBLE_EQ(simlayerkv_score(simlayerkv_score_part(seven.state(6, 1), 1, 1, 4, 4)), 1.0);
}

TEST(SimLayerKvScore, PartsFromHeadSubsetsAddUpToTheWholeLayer) {
  // Tensor parallelism: two ranks with two heads each; summing their parts field by field gives the score of
  // the four heads together (spec 8).
  Sums all(4, 10), rank0(2, 10), rank1(2, 10);
  const float masses[4] = {1.0f, 0.5f, 0.25f, 0.75f};
  for (int h = 0; h < 4; ++h) {
    all.set(h, 8, masses[h]);
    (h < 2 ? rank0 : rank1).set(h % 2, 8, masses[h]);
  }
  const SimLayerKvScorePart a = simlayerkv_score_part(rank0.state(9, 1), 2, 1, 2, 4);
  const SimLayerKvScorePart b = simlayerkv_score_part(rank1.state(9, 1), 2, 1, 2, 4);
  EXPECT_EQ(a.heads, 2);
  const SimLayerKvScorePart total{a.mass + b.mass, a.heads + b.heads};
  EXPECT_DOUBLE_EQ(simlayerkv_score(total), 0.625);
  EXPECT_DOUBLE_EQ(simlayerkv_score(simlayerkv_score_part(all.state(9, 1), 4, 1, 2, 4)), 0.625);
}

TEST(SimLayerKvPolicy, NeverTrimsALayerThatHoldsAtMostInitialPlusWindow) {
  // Defaults: n_init 4 + window 1024 = 1028. A 1027-token prompt gives 1028 entries at the first decode step:
  // no statistics asked, no trim even at threshold 0, decided non-lazy.
  auto p = make({{"threshold", "0"}});
  EXPECT_FALSE(p->needs(bare_state(1027, 1027, 0)).decode_probabilities);
  EXPECT_FALSE(p->on_decode_step(bare_state(1027, 1028, 1)).has_value());
  ASSERT_TRUE(test::verdict(*p, "lazy").has_value());
  EXPECT_FALSE(*test::verdict(*p, "lazy"));
  // It stays decided: the layer outgrowing 1028 later changes nothing (spec 2.2, one decision per request).
  EXPECT_FALSE(p->needs(bare_state(1027, 1028, 1)).decode_probabilities);
  EXPECT_FALSE(p->on_decode_step(bare_state(1027, 1029, 2)).has_value());
  // The small configuration at its limit: 6 entries = n_init + window, all the mass on S.
  auto q = make(small({{"threshold", "0"}}));
  Sums sums(2, 6);
  sums.set(0, 0, 1.0f).set(1, 5, 1.0f);
  EXPECT_FALSE(q->on_decode_step(sums.state(5, 1)).has_value());
  EXPECT_FALSE(*test::verdict(*q, "lazy"));
}

TEST(SimLayerKvPolicy, DefaultsKeepFourInitialAndTheLast1024Entries) {
  // A 1028-token prompt: 1029 entries at the first decode step, the smallest layer that can be trimmed.
  auto p = make({}, 1, 1);
  EXPECT_TRUE(p->needs(bare_state(1028, 1028, 0)).decode_probabilities);
  Sums sums(1, 1029);
  sums.set(0, 0, 0.5f).set(0, 1028, 0.5f);
  const auto sel = p->on_decode_step(sums.state(1028, 1));
  ASSERT_TRUE(sel.has_value());
  EXPECT_EQ(sel->kept[0], join(ascending(0, 4), ascending(5, 1029)));
  // A 2000-token prompt drops 2001 - 1028 entries from the middle.
  auto q = make({}, 1, 1);
  Sums long_sums(1, 2001);
  long_sums.set(0, 3, 0.5f).set(0, 977, 0.5f);
  const auto long_sel = q->on_decode_step(long_sums.state(2000, 1));
  ASSERT_TRUE(long_sel.has_value());
  EXPECT_EQ(long_sel->kept[0], join(ascending(0, 4), ascending(977, 2001)));
}

TEST(SimLayerKvPolicy, DecidesOnlyOnce) {
  // Lazy at the first step; later steps return nothing even with sums that would change the verdict, and the
  // lazy layer grows (official behaviour, spec D3).
  auto lazy = make(small());
  ASSERT_TRUE(lazy->on_decode_step(first_step_sums(1.0f, 1.0f).state(9, 1)).has_value());
  for (int step = 2; step <= 5; ++step) {
    Sums grown(2, 6 + step - 1);  // all the mass on entry 2, outside S: a first step would score 0
    grown.set(0, 2, 1.0f).set(1, 2, 1.0f);
    EXPECT_FALSE(lazy->on_decode_step(grown.state(9, step)).has_value()) << "step " << step;
    EXPECT_TRUE(*test::verdict(*lazy, "lazy"));
  }
  // Not lazy at the first step; a later step that puts everything on S does not make it lazy.
  auto busy = make(small());
  ASSERT_FALSE(busy->on_decode_step(first_step_sums(0.5f, 0.5f).state(9, 1)).has_value());
  Sums all_on_s(2, 11);
  all_on_s.set(0, 0, 1.0f).set(1, 10, 1.0f);
  EXPECT_FALSE(busy->on_decode_step(all_on_s.state(9, 2)).has_value());
  EXPECT_FALSE(*test::verdict(*busy, "lazy"));
}

TEST(SimLayerKvPolicy, BoundedLazyLayerSlidesItsWindow) {
  auto p = make(small({{"bounded", "true"}}));
  // `held` maps each entry to the prompt/generated position it holds; selections compact it as the cache does.
  std::vector<int32_t> held = ascending(0, 10);
  auto apply = [&held](const Selection& sel) {
    std::vector<int32_t> next;
    for (int32_t e : sel.kept[0]) next.push_back(held[e]);
    held = next;
  };
  const auto first = p->on_decode_step(first_step_sums(1.0f, 1.0f).state(9, 1));
  ASSERT_TRUE(first.has_value());
  apply(*first);
  EXPECT_EQ(held, (std::vector<int32_t>{0, 1, 6, 7, 8, 9}));
  for (int step = 2; step <= 6; ++step) {
    held.push_back(9 + step - 1);  // this step's token
    EXPECT_FALSE(p->needs(bare_state(9, int(held.size()) - 1, step - 1)).decode_probabilities);
    const auto sel = p->on_decode_step(bare_state(9, int(held.size()), step));
    ASSERT_TRUE(sel.has_value()) << "step " << step;
    EXPECT_EQ(sel->kept[0], (std::vector<int32_t>{0, 1, 3, 4, 5, 6})) << "step " << step;
    apply(*sel);
    EXPECT_EQ(held, join({0, 1}, ascending(9 + step - 4, 9 + step))) << "step " << step;
  }
}

TEST(SimLayerKvPolicy, BoundedLazyLayerOnAQuantizedPoolSlidesAGroupsWorthAtOnce) {
  // decode_eviction_batch 3 stands in for a quantized pool's 32: after the decision the lazy layer holds
  // n_init + window = 6 entries, grows to 8, and the step that brings it to 9 slides the window by 3.
  PolicySpec spec;
  spec.name = "simlayerkv";
  spec.params = small({{"bounded", "true"}});
  PolicyContext context;
  context.n_heads = 2;
  context.decode_eviction_batch = 3;
  auto p = make_simlayerkv_policy(spec, context);
  ASSERT_TRUE(p->on_decode_step(first_step_sums(1.0f, 1.0f).state(9, 1)).has_value());
  EXPECT_FALSE(p->on_decode_step(bare_state(9, 7, 2)).has_value());
  EXPECT_FALSE(p->on_decode_step(bare_state(9, 8, 3)).has_value());
  const auto sel = p->on_decode_step(bare_state(9, 9, 4));
  ASSERT_TRUE(sel.has_value());
  EXPECT_EQ(sel->kept[0], (std::vector<int32_t>{0, 1, 5, 6, 7, 8}));
}

TEST(SimLayerKvPolicy, BoundedNonLazyLayerKeepsEverything) {
  auto p = make(small({{"bounded", "true"}}));
  ASSERT_FALSE(p->on_decode_step(first_step_sums(0.5f, 0.5f).state(9, 1)).has_value());
  for (int step = 2; step <= 4; ++step) {
    EXPECT_FALSE(p->on_decode_step(bare_state(9, 9 + step, step)).has_value()) << "step " << step;
  }
}

TEST(SimLayerKvPolicy, PrefillStrategyDecidesAndTrimsAtPrefillEnd) {
  // A 10-token prompt, the last 3 rows (7, 8, 9) summed. Per row, the mass on S averages to 0.75 for head 0 and
  // 0.875 for head 1: score 0.8125 > 0.75.
  auto p = make(small({{"strategy", "prefill"}, {"prefill_rows", "3"}}));
  const PolicyNeeds at_start = p->needs(bare_state(10, 0, 0));
  EXPECT_EQ(at_start.prefill_rows_from, 7);
  EXPECT_FALSE(at_start.decode_probabilities);
  Sums sums(2, 10);
  sums.set(0, 0, 1.5f).set(0, 7, 0.5f).set(0, 9, 0.25f).set(0, 4, 0.75f);   // 2.25 of 3 rows on S
  sums.set(1, 1, 1.0f).set(1, 6, 1.0f).set(1, 8, 0.625f).set(1, 2, 0.375f);  // 2.625 of 3 rows on S
  const auto sel = p->on_prefill_end(sums.state(10, 0));
  ASSERT_TRUE(sel.has_value());
  EXPECT_EQ(sel->kept[0], (std::vector<int32_t>{0, 1, 6, 7, 8, 9}));
  EXPECT_TRUE(*test::verdict(*p, "lazy"));
  // The first decode step already sees the trimmed cache; nothing more is asked or returned.
  const PolicyNeeds before_decode = p->needs(bare_state(10, 6, 0));
  EXPECT_EQ(before_decode.prefill_rows_from, -1);
  EXPECT_FALSE(before_decode.decode_probabilities);
  EXPECT_FALSE(p->on_decode_step(bare_state(10, 7, 1)).has_value());
}

TEST(SimLayerKvPolicy, PrefillStrategyBelowTheThreshold) {
  auto p = make(small({{"strategy", "prefill"}, {"prefill_rows", "2"}}));
  EXPECT_EQ(p->needs(bare_state(10, 0, 0)).prefill_rows_from, 8);
  // Head 0: 1.5 of 2 rows = 0.75; head 1: 1.25 of 2 = 0.625; score 0.6875.
  Sums sums(2, 10);
  sums.set(0, 0, 1.0f).set(0, 9, 0.5f).set(0, 3, 0.5f);
  sums.set(1, 8, 1.25f).set(1, 5, 0.75f);
  EXPECT_FALSE(p->on_prefill_end(sums.state(10, 0)).has_value());
  EXPECT_FALSE(*test::verdict(*p, "lazy"));
}

TEST(SimLayerKvPolicy, PrefillStrategyAveragesOverThePromptRowsThereAre) {
  // A 7-token prompt with prefill_rows 32: all 7 rows are summed and the mean divides by 7 (spec 7), not 32.
  auto p = make(small({{"strategy", "prefill"}, {"prefill_rows", "32"}}), 1, 1);
  EXPECT_EQ(p->needs(bare_state(7, 0, 0)).prefill_rows_from, 0);
  Sums sums(1, 7);
  sums.set(0, 0, 5.0f).set(0, 6, 1.0f).set(0, 2, 1.0f);  // 6 of 7 rows on S = {0, 1, 3, 4, 5, 6}: 0.857
  const auto sel = p->on_prefill_end(sums.state(7, 0));
  ASSERT_TRUE(sel.has_value());
  EXPECT_EQ(sel->kept[0], (std::vector<int32_t>{0, 1, 3, 4, 5, 6}));
}

TEST(SimLayerKvPolicy, PrefillStrategyNeverTrimsAShortPrompt) {
  auto p = make(small({{"strategy", "prefill"}, {"threshold", "0"}}));
  EXPECT_EQ(p->needs(bare_state(6, 0, 0)).prefill_rows_from, -1);
  EXPECT_FALSE(p->on_prefill_end(bare_state(6, 6, 0)).has_value());
  EXPECT_FALSE(*test::verdict(*p, "lazy"));
  EXPECT_FALSE(p->on_decode_step(bare_state(6, 7, 1)).has_value());
}

// SimLayerKV composed with SnapKV: a layer found not lazy is compressed by SnapKV over the same observation rows
// (its window is prefill_rows); a lazy one keeps S as alone.
TEST(SimLayerKvPolicy, AKeptPolicyCompressesTheLayersFoundNotLazy) {
  const Params composed = small({{"strategy", "prefill"}, {"prefill_rows", "2"}, {"kept", "snapkv"},
                                 {"kept_budget", "5"}});
  PolicySpec snap{"snapkv", {{"budget", "5"}, {"window", "2"}}};
  PolicyContext context;
  context.global_layer = 3;
  context.n_layers_total = 8;
  context.n_heads = 2;
  context.n_kv_heads = 1;
  // Not lazy (score 0.6875 as in PrefillStrategyBelowTheThreshold): SnapKV's selection.
  Sums below(2, 10);
  below.set(0, 0, 1.0f).set(0, 9, 0.5f).set(0, 3, 0.5f);
  below.set(1, 8, 1.25f).set(1, 5, 0.75f);
  auto p = make(composed);
  EXPECT_EQ(p->needs(bare_state(10, 0, 0)).prefill_rows_from, 8);
  const auto kept = p->on_prefill_end(below.state(10, 0));
  const auto alone = make_policy(snap, context)->on_prefill_end(below.state(10, 0));
  ASSERT_TRUE(kept.has_value() && alone.has_value());
  EXPECT_EQ(kept->kept, alone->kept);
  EXPECT_EQ(kept->kept[0].size(), 5u);
  EXPECT_FALSE(*test::verdict(*p, "lazy"));
  // Lazy: S, as without a kept policy.
  Sums above(2, 10);
  above.set(0, 0, 2.0f);
  above.set(1, 9, 2.0f);
  auto q = make(composed);
  const auto lazy = q->on_prefill_end(above.state(10, 0));
  ASSERT_TRUE(lazy.has_value());
  EXPECT_EQ(lazy->kept[0], kSmallKept);
  EXPECT_TRUE(*test::verdict(*q, "lazy"));
  // A prompt too short to trim is still compressed by the kept policy, which asks for the rows.
  auto r = make(small({{"strategy", "prefill"}, {"prefill_rows", "2"}, {"kept", "snapkv"}, {"kept_budget", "3"}}));
  EXPECT_EQ(r->needs(bare_state(6, 0, 0)).prefill_rows_from, 4);
}

TEST(SimLayerKvPolicy, AKeptPolicyNeedsThePrefillStrategyAndItsRows) {
  auto rejects = [](const Params& params, const std::string& key) {
    try {
      make(params);
      ADD_FAILURE() << "accepted, expected an error naming " << key;
    } catch (const PolicyError& e) {
      EXPECT_EQ(e.param(), key) << e.what();
    }
  };
  rejects(small({{"kept", "snapkv"}, {"kept_budget", "5"}}), "kept");  // strategy=decode
  rejects(small({{"strategy", "prefill"}, {"kept", "snapkv"}, {"kept_window", "8"}}), "kept_window");
  rejects(small({{"kept_budget", "5"}}), "kept");
  rejects(small({{"strategy", "prefill"}, {"kept", "h2o"}}), "kept");
  rejects(small({{"strategy", "prefill"}, {"kept", "pyramidkv"}, {"kept_budget", "1"}}), "kept_budget");
}

TEST(SimLayerKvPolicy, GqaAveragesOverQueryHeadsNotKvHeads) {
  // 4 query heads over 2 KV heads. Masses 0.875, 0.875, 0.5, 0.5: the mean over query heads is 0.6875, not lazy.
  // Reading only the first 2 heads (0.875) or dividing by the KV head count (1.375) would make it lazy.
  auto p = make(small(), 4, 2);
  Sums sums(4, 10);
  const float busy[4] = {0.875f, 0.875f, 0.5f, 0.5f};
  for (int h = 0; h < 4; ++h) sums.set(h, 9, busy[h]).set(h, 4, 1 - busy[h]);
  EXPECT_FALSE(p->on_decode_step(sums.state(9, 1)).has_value());
  EXPECT_FALSE(*test::verdict(*p, "lazy"));
  // Masses 1, 1, 0.5, 0.625: mean 0.78125, lazy; one list for both KV heads.
  auto q = make(small(), 4, 2);
  Sums lazy_sums(4, 10);
  const float lazy_masses[4] = {1.0f, 1.0f, 0.5f, 0.625f};
  for (int h = 0; h < 4; ++h) lazy_sums.set(h, 0, lazy_masses[h]).set(h, 3, 1 - lazy_masses[h]);
  const auto sel = q->on_decode_step(lazy_sums.state(9, 1));
  ASSERT_TRUE(sel.has_value());
  ASSERT_EQ(sel->kept.size(), 1u);
  EXPECT_EQ(sel->kept[0], kSmallKept);
}

TEST(SimLayerKvPolicy, DefaultThresholdPerModel) {
  // δ from spec 3 by model family; 0.9 for models without a tuned value (SmolLM2, LLaMA 1, an empty name).
  const std::vector<std::pair<std::string, double>> table = {
      {"Llama-2-7b-chat-hf", 0.65},       {"llama2-7b-chat-4k", 0.65},
      {"Meta-Llama-3-8B-Instruct", 0.9},  {"llama-3-8b", 0.9},
      {"Llama-3.1-70B-Instruct", 0.9},    {"Mistral-7B-Instruct-v0.3", 0.8},
      {"Qwen2.5-3B-Instruct", 0.85},      {"SmolLM2-135M-Instruct.Q4_1", 0.9},
      {"llama-30b", 0.9},                 {"", 0.9},
  };
  for (const auto& [model, delta] : table) {
    for (const double offset : {-0.01, 0.01}) {
      auto p = make({{"n_init", "2"}, {"window", "4"}}, 1, 1, model);
      Sums sums(1, 10);
      sums.set(0, 0, float(delta + offset)).set(0, 4, float(1 - delta - offset));
      p->on_decode_step(sums.state(9, 1));
      EXPECT_EQ(*test::verdict(*p, "lazy"), offset > 0) << model << " score " << delta + offset;
    }
  }
  // An explicit threshold wins over the model's.
  auto p = make({{"n_init", "2"}, {"window", "4"}, {"threshold", "0.9"}}, 1, 1, "Llama-2-7b-chat-hf");
  Sums sums(1, 10);
  sums.set(0, 0, 0.8f).set(0, 4, 0.2f);
  p->on_decode_step(sums.state(9, 1));
  EXPECT_FALSE(*test::verdict(*p, "lazy"));
}

TEST(SimLayerKvPolicy, MissingSumsForADecisionAreAnError) {
  auto p = make(small());
  EXPECT_THROW(p->on_decode_step(bare_state(9, 10, 1)), std::logic_error);
}

TEST(SimLayerKvPolicy, ParameterErrorsNameTheParameter) {
  const std::vector<std::pair<Params, std::string>> cases = {
      {{{"threshold", "1.5"}}, "threshold"},
      {{{"threshold", "-0.1"}}, "threshold"},
      {{{"threshold", "high"}}, "threshold"},
      {{{"n_init", "-1"}}, "n_init"},
      {{{"window", "0"}}, "window"},
      {{{"window", "ten"}}, "window"},
      {{{"strategy", "both"}}, "strategy"},
      {{{"strategy", "prefill"}, {"prefill_rows", "0"}}, "prefill_rows"},
      {{{"prefill_rows", "32"}}, "prefill_rows"},  // only with strategy=prefill
      {{{"compare", ">="}}, "compare"},
      {{{"bounded", "maybe"}}, "bounded"},
      {{{"budget", "128"}}, "budget"},  // not a SimLayerKV parameter
  };
  for (const auto& [params, param] : cases) {
    try {
      make(params);
      ADD_FAILURE() << "no error for " << param;
    } catch (const PolicyError& e) {
      EXPECT_EQ(e.param(), param) << e.what();
    }
  }
}

TEST(SimLayerKvPolicy, AcceptsEveryDocumentedParameter) {
  EXPECT_NO_THROW(make({{"threshold", "0.5"},
                        {"n_init", "0"},
                        {"window", "16"},
                        {"strategy", "prefill"},
                        {"prefill_rows", "8"},
                        {"compare", "paper"},
                        {"bounded", "true"},
                        {"kept", "pyramidkv"},
                        {"kept_budget", "64"}}));
  EXPECT_NO_THROW(make({{"strategy", "decode"}, {"compare", "code"}, {"bounded", "false"}}));
}

}  // namespace
}  // namespace strata
