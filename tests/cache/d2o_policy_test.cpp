// The `d2o` policy on hand-built layer states: what it asks for, the allocation handed to it, eviction with sinks
// and a recent window per KV head, the merges and the threshold over several decode steps, its modes and its
// parameter errors. Keys come from a host fake of LayerKeys that computes cosines exactly.
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cache/policies/policies.h"
#include "tests/cache/policy_test_states.h"
#include "tests/observed.h"

namespace strata {
namespace {

using Ids = std::vector<int32_t>;
using Vec = std::vector<float>;

std::unique_ptr<CompressionPolicy> d2o(const std::string& params, int layer = 0, int n_layers = 1, int n_heads = 2,
                                       int n_kv_heads = 1) {
  return make_d2o_policy(parse_policy_spec("d2o" + (params.empty() ? "" : ":" + params)),
                         test::policy_context(n_heads, n_kv_heads, layer, n_layers));
}

// Keys per KV head and entry, compacted like the cache. Merged keys are not recomputed: the tests below choose
// entries whose matches do not depend on them.
class VectorKeys final : public LayerKeys {
 public:
  explicit VectorKeys(std::vector<std::vector<Vec>> keys) : keys_(std::move(keys)) {}

  void nearest(int kv_head, std::span<const int32_t> queries, std::span<const int32_t> candidates,
               std::span<float> best_similarity, std::span<int32_t> best_candidate) const override {
    const std::vector<Vec>& k = keys_[size_t(kv_head)];
    for (size_t i = 0; i < queries.size(); ++i) {
      double best = -2.0;
      for (size_t c = 0; c < candidates.size(); ++c) {
        const double cos = cosine(k[size_t(queries[i])], k[size_t(candidates[c])]);
        if (cos > best) {
          best = cos;
          best_candidate[i] = int32_t(c);
        }
      }
      best_similarity[i] = float(best);
    }
  }
  // D2O never asks for key forms (Expected Attention's question); this fake has no values to answer it with.
  void key_forms(int, std::span<const float>, std::span<const float>, std::span<float>,
                 std::span<float>) const override {
    throw std::logic_error("VectorKeys: no key forms");
  }

  void append(std::vector<Vec> per_head) {
    for (size_t g = 0; g < keys_.size(); ++g) keys_[g].push_back(per_head[g]);
  }
  void compact(const Selection& selection) {
    for (size_t g = 0; g < keys_.size(); ++g) {
      std::vector<Vec> kept;
      for (int32_t e : selection.kept[selection.kept.size() == 1 ? 0 : g]) kept.push_back(keys_[g][size_t(e)]);
      keys_[g] = kept;
    }
  }

 private:
  static double cosine(const Vec& a, const Vec& b) {
    double dot = 0, na = 0, nb = 0;
    for (size_t d = 0; d < a.size(); ++d) {
      dot += double(a[d]) * b[d];
      na += double(a[d]) * a[d];
      nb += double(b[d]) * b[d];
    }
    return dot / (std::max(std::sqrt(na), 1e-8) * std::max(std::sqrt(nb), 1e-8));
  }
  std::vector<std::vector<Vec>> keys_;
};

Vec unit(int axis, int dim = 12) {
  Vec v(size_t(dim), 0.0f);
  v[size_t(axis)] = 1.0f;
  return v;
}
Vec mix(float a, int axis_a, float b, int axis_b) {
  Vec v = unit(axis_a);
  v[size_t(axis_a)] = a;
  v[size_t(axis_b)] = b;
  return v;
}

using test::at;

// The scenario of the merge tests: 2 query heads in 1 KV head, 17 prompt entries. Heavy hitters at the even
// entries 2..12 (score 5), every other entry 1. One layer (so its share is rho = 0.6 whatever its statistic),
// hh_ratio 0.4, recent_ratio 0.2, 1 sink: at the first decode step (18 entries) heavy = floor(7.2) = 7 (the sink
// and 6), recent = floor(3.6) = 3; S = 10.
constexpr int kPrompt = 17;
const char* kParams = "hh_ratio=0.4,recent_ratio=0.2,sinks=1,exempt=none";

std::vector<float> merge_scenario_prompt_sums() {
  std::vector<float> row(kPrompt, 1.0f);
  for (int e = 2; e <= 12; e += 2) row[size_t(e)] = 5.0f;
  std::vector<float> sums = row;
  sums.insert(sums.end(), row.begin(), row.end());  // both query heads alike
  return sums;
}

// Keys in 12 dimensions. Kept: 0 e0, 2 e1, 4 e2, 6 e3, 8 e4, 10 e5, 12 e6, 15 e7, 16 0.6 e7 + 0.8 e10, 17 e7.
// Evicted at the first step, with their nearest kept entry and cosine:
//   1 e1 -> 2 (1)   3 e8 -> 0 (0)   5 (e2 + e8)/sqrt2 -> 4 (0.7071)   7 e9 -> 0 (0)
//   9 e5 -> 10 (1)  11 0.6 e6 + 0.8 e9 -> 12 (0.6)   13 e1 -> 2 (1)   14 e8 -> 0 (0)
VectorKeys merge_scenario_keys() {
  std::vector<Vec> k(18);
  k[0] = unit(0);
  for (int i = 1; i <= 6; ++i) k[size_t(2 * i)] = unit(i);
  k[15] = unit(7);
  k[16] = mix(0.6f, 7, 0.8f, 10);
  k[17] = unit(7);
  k[1] = unit(1);
  k[3] = unit(8);
  k[5] = mix(float(1 / std::sqrt(2.0)), 2, float(1 / std::sqrt(2.0)), 8);
  k[7] = unit(9);
  k[9] = unit(5);
  k[11] = mix(0.6f, 6, 0.8f, 9);
  k[13] = unit(1);
  k[14] = unit(8);
  return VectorKeys({k});
}

TEST(D2oPolicy, AsksForEveryPromptRowThenEachDecodeQuery) {
  auto p = d2o("", 2, 30);
  EXPECT_EQ(p->name(), "d2o");
  EXPECT_EQ(p->needs(test::start(100)).prefill_rows_from, 0);
  EXPECT_FALSE(p->needs(test::start(100)).decode_probabilities);
  EXPECT_TRUE(p->needs(at(100, 100, 1, {})).decode_probabilities);
  EXPECT_TRUE(p->cross_layer());
  EXPECT_FALSE(test::observed(*p, "capacity").has_value());
  // Exempt layers (code: 0, 1 and L-1) still need the prompt rows for their statistic, but nothing after.
  for (int layer : {0, 1, 29}) {
    auto exempt = d2o("", layer, 30);
    EXPECT_EQ(exempt->needs(test::start(100)).prefill_rows_from, 0) << layer;
    EXPECT_FALSE(exempt->needs(at(100, 100, 1, {})).decode_probabilities) << layer;
  }
  EXPECT_TRUE(d2o("exempt=none", 0, 30)->needs(at(100, 100, 1, {})).decode_probabilities);
}

TEST(D2oPolicy, FirstDecodeStepEvictsAndMergesThenOneTokenPerStep) {
  auto p = d2o(std::string(kParams) + ",merge_weight=code_mean");
  VectorKeys keys = merge_scenario_keys();
  const std::vector<float> prompt = merge_scenario_prompt_sums();
  EXPECT_FALSE(p->on_prefill_end(at(kPrompt, kPrompt, 0, prompt)).has_value());
  EXPECT_FALSE(std::isnan(p->layer_statistic()));
  EXPECT_FALSE(p->on_layer_statistics(at(kPrompt, kPrompt, 0, {}), std::vector<double>{p->layer_statistic()})
                   .has_value());

  // Step 1: 18 entries; the decode query's probabilities are all 0, so the prompt's scores decide.
  std::optional<Selection> sel = p->on_decode_step(at(kPrompt, 18, 1, std::vector<float>(2 * 18, 0.0f), &keys));
  ASSERT_TRUE(sel.has_value());
  ASSERT_EQ(sel->kept.size(), 1u);
  EXPECT_EQ(sel->kept[0], (Ids{0, 2, 4, 6, 8, 10, 12, 15, 16, 17}));
  EXPECT_EQ(test::observed(*p, "capacity"), 10);
  // tau = mean of {1, 0, 0.7071, 0, 1, 0.6, 1, 0} = 0.5384: entries 1, 5, 9, 11 and 13 merge; 3, 7, 14 do not.
  ASSERT_EQ(sel->merges.size(), 1u);
  const KvMerges& m = sel->merges[0];
  EXPECT_EQ(m.targets, (Ids{2, 4, 10, 12}));
  EXPECT_EQ(m.source_begin, (Ids{0, 2, 3, 4, 5}));
  EXPECT_EQ(m.sources, (Ids{1, 13, 5, 9, 11}));
  // code_mean: (k + sum u k_e) / (1 + n).
  EXPECT_FLOAT_EQ(m.target_weights[0], 1.0f / 3);
  EXPECT_FLOAT_EQ(m.source_weights[0], 1.0f / 3);
  EXPECT_FLOAT_EQ(m.source_weights[1], 1.0f / 3);
  EXPECT_FLOAT_EQ(m.target_weights[1], 0.5f);
  EXPECT_NEAR(m.source_weights[2], 0.5 / std::sqrt(2.0), 1e-6);
  EXPECT_FLOAT_EQ(m.source_weights[3], 0.5f);
  EXPECT_NEAR(m.source_weights[4], 0.3, 1e-6);
  keys.compact(*sel);

  // Step 2: 11 entries (10 + the new one, e0). Candidates [1, 8): the six heavy hitters and old entry 15, which
  // left the window and scores 1: it goes. Its nearest kept key is old 17 (now 9), cosine 1 >= the new
  // tau = 0.5 * 0.5384 + 0.5 * 1 = 0.7692: merged, (k + 1 k_e) / 2.
  keys.append({unit(0)});
  sel = p->on_decode_step(at(kPrompt, 11, 2, std::vector<float>(2 * 11, 0.0f), &keys));
  ASSERT_TRUE(sel.has_value());
  EXPECT_EQ(sel->kept[0], (Ids{0, 1, 2, 3, 4, 5, 6, 8, 9, 10}));
  EXPECT_EQ(sel->merges[0].targets, (Ids{9}));
  EXPECT_EQ(sel->merges[0].sources, (Ids{7}));
  EXPECT_FLOAT_EQ(sel->merges[0].target_weights[0], 0.5f);
  EXPECT_FLOAT_EQ(sel->merges[0].source_weights[0], 0.5f);
  keys.compact(*sel);

  // Step 3: old entry 16 goes; its best cosine is 0.6 (old 17), below tau = 0.5 * 0.7692 + 0.5 * 0.6 = 0.6846:
  // dropped for good. The layer stays at S = 10.
  keys.append({unit(11)});
  sel = p->on_decode_step(at(kPrompt, 11, 3, std::vector<float>(2 * 11, 0.0f), &keys));
  ASSERT_TRUE(sel.has_value());
  EXPECT_EQ(sel->kept[0], (Ids{0, 1, 2, 3, 4, 5, 6, 8, 9, 10}));
  ASSERT_EQ(sel->merges.size(), 1u);
  EXPECT_TRUE(sel->merges[0].empty());
}

TEST(D2oPolicy, PaperSoftmaxWeightsAndNoMerge) {
  auto p = d2o(std::string(kParams) + ",merge_weight=paper_softmax");
  VectorKeys keys = merge_scenario_keys();
  p->on_prefill_end(at(kPrompt, kPrompt, 0, merge_scenario_prompt_sums()));
  p->on_layer_statistics(at(kPrompt, kPrompt, 0, {}), std::vector<double>{0.3});
  std::optional<Selection> sel = p->on_decode_step(at(kPrompt, 18, 1, std::vector<float>(2 * 18, 0.0f), &keys));
  ASSERT_TRUE(sel.has_value());
  const KvMerges& m = sel->merges[0];
  EXPECT_EQ(m.sources, (Ids{1, 13, 5, 9, 11}));
  // Target 2 with two sources at cosine 1: e / 3e each; target 4: e / (e + e^0.7071).
  EXPECT_FLOAT_EQ(m.target_weights[0], 1.0f / 3);
  EXPECT_FLOAT_EQ(m.source_weights[1], 1.0f / 3);
  const double z = std::exp(1.0) + std::exp(1 / std::sqrt(2.0));
  EXPECT_NEAR(m.target_weights[1], std::exp(1.0) / z, 1e-6);
  EXPECT_NEAR(m.source_weights[2], std::exp(1 / std::sqrt(2.0)) / z, 1e-6);

  // merge=false: the same eviction, nothing merged, no keys needed.
  auto plain = d2o(std::string(kParams) + ",merge=false");
  plain->on_prefill_end(at(kPrompt, kPrompt, 0, merge_scenario_prompt_sums()));
  plain->on_layer_statistics(at(kPrompt, kPrompt, 0, {}), std::vector<double>{0.3});
  sel = plain->on_decode_step(at(kPrompt, 18, 1, std::vector<float>(2 * 18, 0.0f)));
  ASSERT_TRUE(sel.has_value());
  EXPECT_EQ(sel->kept[0], (Ids{0, 2, 4, 6, 8, 10, 12, 15, 16, 17}));
  EXPECT_TRUE(sel->merges.empty());
}

TEST(D2oPolicy, SelectsPerKvHeadWithTheSinksAndTheWindow) {
  // 4 query heads, 2 KV heads, defaults (4 sinks, 0.1 / 0.1), one layer: share 0.2. 20 prompt entries; at the
  // first decode step (21): heavy = max(floor(2.1), 5) = 5 (the 4 sinks and 1), recent = 2.
  auto p = d2o("merge=false,exempt=none", 0, 1, 4, 2);
  std::vector<float> sums(4 * 20, 0.0f);
  sums[0 * 20 + 10] = 3;  // KV 0 (heads 0 and 1): entry 10
  sums[1 * 20 + 11] = 2;
  sums[2 * 20 + 12] = 4;  // KV 1 (heads 2 and 3): entry 12
  sums[3 * 20 + 0] = 9;   // a sink: kept anyway, never counted among the heavy hitters
  p->on_prefill_end(at(20, 20, 0, sums));
  p->on_layer_statistics(at(20, 20, 0, {}), std::vector<double>{0.0});
  std::optional<Selection> sel = p->on_decode_step(at(20, 21, 1, std::vector<float>(4 * 21, 0.0f)));
  ASSERT_TRUE(sel.has_value());
  ASSERT_EQ(sel->kept.size(), 2u);
  EXPECT_EQ(sel->kept[0], (Ids{0, 1, 2, 3, 10, 19, 20}));
  EXPECT_EQ(sel->kept[1], (Ids{0, 1, 2, 3, 12, 19, 20}));
  EXPECT_EQ(test::observed(*p, "capacity"), 7);
  // Next step, 8 entries: candidates [4, 6) = the heavy hitter and old 19; this step's query puts 4 on entry 5
  // in head 0 only (KV 0: mean 2 against its heavy hitter's 1.5), so KV 0 keeps old 19 and KV 1 its heavy hitter.
  std::vector<float> step(4 * 8, 0.0f);
  step[0 * 8 + 5] = 4.0f;
  sel = p->on_decode_step(at(20, 8, 2, step));
  ASSERT_TRUE(sel.has_value());
  EXPECT_EQ(sel->kept[0], (Ids{0, 1, 2, 3, 5, 6, 7}));
  EXPECT_EQ(sel->kept[1], (Ids{0, 1, 2, 3, 4, 6, 7}));
}

TEST(D2oPolicy, TheAllocationSetsEachLayersBudget) {
  // Three layers, sigma = {0, ln 2, 0}, rho = 0.2: shares {0.24, 0.12, 0.24} (d2o_allocation_test); layer 1
  // keeps 0.12 of 101 entries: heavy = max(floor(6.06), 5) = 6, recent = 6.
  auto p = d2o("exempt=none,merge=false", 1, 3);
  std::vector<float> sums(2 * 100, 1.0f);
  p->on_prefill_end(at(100, 100, 0, sums));
  p->on_layer_statistics(at(100, 100, 0, {}), std::vector<double>{0.0, std::log(2.0), 0.0});
  std::optional<Selection> sel = p->on_decode_step(at(100, 101, 1, std::vector<float>(2 * 101, 0.0f)));
  ASSERT_TRUE(sel.has_value());
  EXPECT_EQ(sel->kept[0].size(), 12u);
  EXPECT_EQ(test::observed(*p, "capacity"), 12);
}

TEST(D2oPolicy, EvictAtPrefillEndAfterTheLayerStatistics) {
  // n = 17 at prefill end: heavy = floor(6.8) = 6, recent = floor(3.4) = 3. Candidates [1, 14), top 5 of the
  // tied heavy hitters 2..12: the lower entries win.
  auto p = d2o(std::string(kParams) + ",merge=false,evict_at=prefill_end");
  EXPECT_FALSE(p->on_prefill_end(at(kPrompt, kPrompt, 0, merge_scenario_prompt_sums())).has_value());
  std::optional<Selection> sel = p->on_layer_statistics(at(kPrompt, kPrompt, 0, {}), std::vector<double>{0.5});
  ASSERT_TRUE(sel.has_value());
  EXPECT_EQ(sel->kept[0], (Ids{0, 2, 4, 6, 8, 10, 14, 15, 16}));
  EXPECT_EQ(test::observed(*p, "capacity"), 9);
  // Then one per step.
  sel = p->on_decode_step(at(kPrompt, 10, 1, std::vector<float>(2 * 10, 0.0f)));
  ASSERT_TRUE(sel.has_value());
  EXPECT_EQ(sel->kept[0].size(), 9u);
}

TEST(D2oPolicy, PaperGateDecidesAloneFromTheRawVariance) {
  // Each head's column sums: 17 on the first entry, 0 on the 16 others (every one of the 17 rows attends to the
  // first entry only). Variance 17, above a gate of 1: sparse, the layer keeps rho = 0.6 (10 of 18 entries);
  // below a gate of 1e9: dense, it keeps min(2 * 0.6, 1) = 1, every entry.
  std::vector<float> row(kPrompt, 0.0f);
  row[0] = 17.0f;
  std::vector<float> sums = row;
  sums.insert(sums.end(), row.begin(), row.end());
  for (const auto& [gate, expect_kept] : {std::pair{1.0, 10u}, std::pair{1e9, 18u}}) {
    auto p = d2o(std::string(kParams) + ",merge=false,layer_rule=paper_gate,gate=" + std::to_string(gate));
    EXPECT_FALSE(p->cross_layer());
    p->on_prefill_end(at(kPrompt, kPrompt, 0, sums));
    EXPECT_NEAR(p->layer_statistic(), 17.0, 1e-9);  // Var of {17, 0 x 16}: (16^2 + 16 x 1) / 16 = 17
    std::optional<Selection> sel = p->on_decode_step(at(kPrompt, 18, 1, std::vector<float>(2 * 18, 0.0f)));
    EXPECT_EQ(sel.has_value() ? sel->kept[0].size() : 18u, expect_kept) << gate;
  }
}

TEST(D2oPolicy, ShortPromptsAreLeftAlone) {
  // 4 sinks + 16: a 19-entry prompt is not compressed and asks for nothing.
  auto p = d2o("exempt=none");
  EXPECT_EQ(p->needs(test::start(19)).prefill_rows_from, -1);
  EXPECT_FALSE(p->on_prefill_end(at(19, 19, 0, {})).has_value());
  EXPECT_TRUE(std::isnan(p->layer_statistic()));
  EXPECT_FALSE(p->on_layer_statistics(at(19, 19, 0, {}), std::vector<double>{NAN}).has_value());
  EXPECT_FALSE(p->on_decode_step(at(19, 20, 1, {})).has_value());
  EXPECT_EQ(d2o("exempt=none")->needs(test::start(20)).prefill_rows_from, 0);
}

TEST(D2oPolicy, MergingLayersStayUnquantized) {
  // kv_cache.dtype int8 | int4 | int2 seals a layer's groups once needs_unquantized is false.
  auto merging = d2o("", 2, 30);
  EXPECT_TRUE(merging->needs_unquantized(at(100, 100, 0, {})));
  EXPECT_TRUE(merging->needs_unquantized(at(100, 30, 50, {})));  // merges rewrite kept entries every step
  for (auto& p : {d2o("merge=false", 2, 30), d2o("", 0, 30)}) {  // not merging, or exempt: the default
    EXPECT_TRUE(p->needs_unquantized(at(100, 100, 0, {})));
    EXPECT_FALSE(p->needs_unquantized(at(100, 30, 1, {})));
  }
  EXPECT_FALSE(d2o("", 2, 30)->needs_unquantized(at(19, 21, 2, {})));  // a short prompt: D2O left it alone
}

TEST(D2oPolicy, ADecodeStepBeforeTheAllocationIsAContractError) {
  auto p = d2o(kParams);
  p->on_prefill_end(at(kPrompt, kPrompt, 0, merge_scenario_prompt_sums()));
  EXPECT_THROW(p->on_decode_step(at(kPrompt, 18, 1, std::vector<float>(2 * 18, 0.0f))), std::logic_error);
}

TEST(D2oPolicy, ParameterErrorsNameTheParameter) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"gqa=q_head", "gqa"},
      {"gqa=other", "gqa"},
      {"hh_ratio=0", "hh_ratio"},
      {"hh_ratio=0.7,recent_ratio=0.5", "recent_ratio"},
      {"recent_ratio=-0.1", "recent_ratio"},
      {"sinks=-1", "sinks"},
      {"layer_rule=gate", "layer_rule"},
      {"gate=50", "gate"},
      {"gate_alpha=3", "gate_alpha"},
      {"layer_rule=paper_gate,gate_alpha=0.5", "gate_alpha"},
      {"merge_weight=sum", "merge_weight"},
      {"merge=maybe", "merge"},
      {"ema_a=1.5", "ema_a"},
      {"ema_b=x", "ema_b"},
      {"exempt=first", "exempt"},
      {"evict_at=never", "evict_at"},
      {"budget=128", "budget"},
  };
  for (const auto& [params, param] : cases) {
    try {
      d2o(params);
      ADD_FAILURE() << params << " was accepted";
    } catch (const PolicyError& e) {
      EXPECT_EQ(e.param(), param) << params << ": " << e.what();
    }
  }
  EXPECT_NO_THROW(d2o("layer_rule=paper_gate,gate=50,gate_alpha=4,merge_weight=paper_softmax,ema_a=0.3,ema_b=0.7,"
                      "exempt=none,evict_at=prefill_end,gqa=kv_head,sinks=0,hh_ratio=0.15,recent_ratio=0.05"));
}

}  // namespace
}  // namespace strata
