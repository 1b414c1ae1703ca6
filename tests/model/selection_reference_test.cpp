// The kept entries of SnapKV, PyramidKV, StreamingLLM and Expected Attention against an independent
// implementation: the spec's arithmetic (../shared/specs/pyramidkv.md, sections 2, 3.1, 3.3, 3.4, 5, 8, with
// Strata's choices from docs/compression.md), and Expected Attention's definition (Devoto et al., 2025; kvpress),
// applied by tools/make_reference_selections.py to the attention probabilities, queries, keys and values of Hugging
// Face transformers on the same GGUF. It wrote tests/fixtures/selections/<prompt>.json (that folder's README.md).
//
// Expected Attention: our forward pass adds each layer's queries before RoPE from position `sinks` on to its
// QueryMoments, and the policy reads them and the keys and values in the pool at on_prefill_end.
//
// KVzip (Kim et al., 2025; kvpress's KVzipPress): the prompt is one chunk, its reconstruction (the fixture's
// scoring ids, which our own reconstruction prompt must equal) runs after it as the chunk's scoring rows, our
// attention keeps each entry's largest probability over those rows (kernels/column_maxima.h), and each layer's
// policy selects at on_prefill_chunk, as at the first compression point of a chunked prefill.
//
// Here our own forward pass computes the column sums the way the step executor asks for them (rows from n - w in
// every layer, stride n; one chunked prefill serves both windows, 8 and 32), and each layer's policy, built
// with make_*_policy from the fixture's spec, selects at on_prefill_end. Every (policy, layer, KV head) must keep
// exactly the reference's entries, except at a near-tie: the reference's scores of the last kept and the first
// dropped candidate differ by at most kNearTie (relative), and every entry on which the two sides differ has a
// reference score that close to the cut. Near-ties are counted and printed; more than kMaxNearTieShare of them
// would hide a systematic difference (a tie rule, say) and fail too.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cache/block_pool.h"
#include "cache/compression_policy.h"
#include "cache/kv_cache.h"
#include "cache/policies/policies.h"
#include "cache/policies/selection.h"
#include "cache/policy_spec.h"
#include "cache/pooled_layer_keys.h"
#include "kernels/backend.h"
#include "model/gguf_file.h"
#include "model/chat_template.h"
#include "model/llama_model.h"
#include "model/model_loader.h"
#include "model/reconstruction_prompt.h"
#include "model/tokenizer.h"
#include "tests/model/smollm2_model.h"
#include "tests/test_paths.h"

namespace strata {
namespace {

// Relative to the score at the cut. Our fp32 forward pass and transformers' differ in summation order; their
// pooled scores near the cuts differ by up to about 1.4e-5 relative (the test prints the largest difference it
// sees), so a cut closer than 1e-4 may legitimately fall either way.
constexpr double kNearTie = 1e-4;
constexpr double kMaxNearTieShare = 0.05;

// "0-3,17,25-26" -> {0, 1, 2, 3, 17, 25, 26}
std::vector<int32_t> parse_ranges(const std::string& text) {
  std::vector<int32_t> out;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, ',')) {
    const size_t dash = part.find('-');
    const int lo = std::stoi(part.substr(0, dash));
    const int hi = dash == std::string::npos ? lo : std::stoi(part.substr(dash + 1));
    for (int i = lo; i <= hi; ++i) out.push_back(i);
  }
  return out;
}

std::string join(const std::vector<int32_t>& v) {
  std::string s;
  for (int32_t x : v) s += (s.empty() ? "" : " ") + std::to_string(x);
  return s;
}

struct Counts {
  int compared = 0, exact = 0, near_ties = 0;
  double worst_score_diff = 0.0;  // largest relative |ours - reference| pooled score over the cut bands
};

class SelectionReferenceTest : public ::testing::TestWithParam<std::string> {
 protected:
  // The column sums of the query rows at positions >= n - w in every layer, for each window w, as the step
  // executor sets them up for an observation-window policy (start_prefill): stride n, one [n_heads][n] buffer per
  // layer. One forward pass serves all windows: the prompt is prefilled in chunks that end at n - w for every w,
  // chunk [n - w_i, n - w_{i+1}) adding its rows to a buffer of its own, and the sums for w are those of all
  // chunks from n - w on (float addition, as the kernel accumulates across the chunks of a chunked prefill).
  static std::map<int, AttentionStats> window_stats(const std::vector<int32_t>& ids, std::vector<int> windows) {
    const ModelConfig& c = test::smollm2().model->config();
    const int n = int(ids.size());
    std::sort(windows.begin(), windows.end(), std::greater<>());
    std::vector<AttentionStats> parts(windows.size());
    KvCache cache(*test::smollm2().pool, 0, c.n_layers);
    std::vector<float> logits;
    int start = 0;
    for (size_t i = 0; i <= windows.size(); ++i) {
      const int end = i < windows.size() ? n - windows[i] : n;
      AttentionStats* stats = nullptr;
      if (i > 0) {
        stats = &parts[i - 1];
        stats->stride = n;
        stats->rows_from.assign(size_t(c.n_layers), n - windows[i - 1]);
        stats->sums.assign(size_t(c.n_layers), std::vector<float>(size_t(c.n_heads) * size_t(n), 0.0f));
      }
      if (end > start) {
        const BatchSequence seq{1, std::span<const int32_t>(ids).subspan(size_t(start), size_t(end - start)),
                                start, LogitsMode::none, stats};
        test::smollm2().model->forward({&seq, 1}, cache, logits);
      }
      start = end;
    }
    std::map<int, AttentionStats> out;
    for (size_t i = 0; i < windows.size(); ++i) {
      AttentionStats total = parts[i];
      for (size_t j = i + 1; j < parts.size(); ++j) {
        for (size_t l = 0; l < total.sums.size(); ++l) {
          for (size_t e = 0; e < total.sums[l].size(); ++e) total.sums[l][e] += parts[j].sums[l][e];
        }
      }
      out.emplace(windows[i], std::move(total));
    }
    return out;
  }

  // Expected Attention's statistics as the step executor gathers them: the prompt prefilled in one step, every
  // layer adding its query rows from position `sinks` to its QueryMoments. The cache keeps the prompt's keys
  // and values for the policies' key forms.
  struct MomentsRun {
    std::unique_ptr<KvCache> cache;
    AttentionStats stats;
  };
  static MomentsRun moments_run(const std::vector<int32_t>& ids, int sinks) {
    const ModelConfig& c = test::smollm2().model->config();
    MomentsRun run{std::make_unique<KvCache>(*test::smollm2().pool, 0, c.n_layers), {}};
    run.stats.rows_from.assign(size_t(c.n_layers), -1);
    run.stats.sums.resize(size_t(c.n_layers));
    run.stats.moments_from.assign(size_t(c.n_layers), sinks);
    for (int l = 0; l < c.n_layers; ++l) run.stats.moments.emplace_back(std::in_place, c.n_heads, c.head_dim);
    const BatchSequence seq{1, ids, 0, LogitsMode::none, &run.stats};
    std::vector<float> logits;
    test::smollm2().model->forward({&seq, 1}, *run.cache, logits);
    return run;
  }
};


std::unique_ptr<CompressionPolicy> make(const PolicySpec& spec, const PolicyContext& context) {
  if (spec.name == "snapkv") return make_snapkv_policy(spec, context);
  if (spec.name == "pyramidkv") return make_pyramidkv_policy(spec, context);
  if (spec.name == "streaming") return make_streaming_policy(spec, context);
  if (spec.name == "expected_attention") return make_expected_attention_policy(spec, context);
  if (spec.name == "kvzip") return make_kvzip_policy(spec, context);
  throw std::runtime_error("no reference for policy " + spec.name);
}

// Our pooled scores of one KV head, recomputed from the same column sums with the same primitives the policy uses,
// only to measure how far they lie from the reference's at the cut.
std::vector<float> our_scores(const AttentionStats& stats, int layer, int kv_head, int n, int window,
                              const PolicySpec& spec, int n_heads, int n_kv_heads) {
  const std::vector<std::vector<float>> reduced = reduce_to_kv_heads(
      stats.sums[size_t(layer)].data(), stats.stride, n_heads, n_kv_heads, n - window, HeadReduction::mean);
  const int kernel = std::stoi(spec.params.at("kernel"));
  const Pooling pooling = spec.params.at("pool") == "max" ? Pooling::max : Pooling::avg;
  return pool1d(reduced[size_t(kv_head)], kernel, pooling);
}

// Compares one (policy, layer, KV head); returns false for a disagreement that no near-tie explains.
bool compare_head(const std::vector<int32_t>& ours, const nlohmann::json& ref, const std::vector<float>& scores,
                  const std::string& where, Counts& counts) {
  ++counts.compared;
  const std::vector<int32_t> expected = parse_ranges(ref.at("kept").get<std::string>());
  std::map<int32_t, double> band;
  for (const nlohmann::json& e : ref.value("band", nlohmann::json::array())) {
    band[e.at(0).get<int32_t>()] = e.at(1).get<double>();
  }
  const double last_kept = ref.value("last_kept", 0.0), first_dropped = ref.value("first_dropped", 0.0);
  const double scale = std::max(std::fabs(last_kept), 1e-30);
  for (const auto& [index, score] : band) {
    if (scores.empty()) break;  // a policy whose scores the test does not recompute
    counts.worst_score_diff = std::max(counts.worst_score_diff, std::fabs(scores[size_t(index)] - score) / scale);
  }
  if (ours == expected) {
    ++counts.exact;
    return true;
  }
  std::vector<int32_t> only_ours, only_ref;
  std::set_difference(ours.begin(), ours.end(), expected.begin(), expected.end(), std::back_inserter(only_ours));
  std::set_difference(expected.begin(), expected.end(), ours.begin(), ours.end(), std::back_inserter(only_ref));
  const double margin = ref.value("margin_rel", 1.0);
  bool explained = ours.size() == expected.size() && margin <= kNearTie;
  std::ostringstream detail;
  detail << where << ": ours only {" << join(only_ours) << "}, reference only {" << join(only_ref)
         << "}, reference cut " << last_kept << " | " << first_dropped << " (relative margin " << margin << ")";
  for (const std::vector<int32_t>* side : {&only_ours, &only_ref}) {
    for (int32_t index : *side) {
      const auto it = band.find(index);
      if (it == band.end()) {
        explained = false;
        detail << "; " << index << " is far from the cut";
        continue;
      }
      const double d = std::min(std::fabs(it->second - last_kept), std::fabs(it->second - first_dropped)) / scale;
      detail << "; " << index << ": reference " << it->second;
      if (!scores.empty()) detail << ", ours " << scores[size_t(index)];
      if (d > kNearTie) explained = false;
    }
  }
  if (explained) {
    ++counts.near_ties;
    std::cout << "[ near-tie  ] " << detail.str() << std::endl;
    return true;
  }
  ADD_FAILURE() << detail.str();
  return false;
}

// One layer's selection of a policy that keeps its sinks and, per KV head, the reference's entry's keep_per_layer
// more: each KV head against the reference, our scores (scores_of, where given) beside its band.
void compare_kv_heads(const std::optional<Selection>& selection, const nlohmann::json& entry, int layer, int sinks,
                      const std::string& where, const std::function<std::vector<float>(int)>& scores_of,
                      Counts& counts, int& disagreements) {
  ASSERT_TRUE(selection.has_value()) << where << ": kept the whole prompt";
  const int n_kv_heads = test::smollm2().model->config().n_kv_heads;
  ASSERT_EQ(selection->kept.size(), size_t(n_kv_heads)) << where;
  const int keep = entry.at("keep_per_layer").at(size_t(layer)).get<int>();
  for (int g = 0; g < n_kv_heads; ++g) {
    const std::string head = where + " KV head " + std::to_string(g);
    EXPECT_EQ(selection->kept[size_t(g)].size(), size_t(keep + sinks)) << head << ": budget";
    const std::vector<float> scores = scores_of ? scores_of(g) : std::vector<float>{};
    if (!compare_head(selection->kept[size_t(g)], entry.at("layers").at(size_t(layer)).at(size_t(g)), scores, head,
                      counts)) {
      ++disagreements;
    }
  }
}

// Expected Attention: each layer's policy, at the prompt's end, reads the run's query moments and, through the
// pool, its keys and values; every KV head keeps the sinks and the reference's top entries.
template <typename Run>
void check_expected_attention(const nlohmann::json& entry, const PolicySpec& spec, const Run& run,
                              const std::string& text, Counts& counts, int& disagreements) {
  const ModelConfig& c = test::smollm2().model->config();
  const int n = run.cache->layer(1, 0).n_entries;
  const int sinks = entry.at("sinks").get<int>();
  for (int layer = 0; layer < c.n_layers; ++layer) {
    const std::string where = text + " layer " + std::to_string(layer);
    PolicyContext context{layer, c.n_layers, c.n_heads, c.n_kv_heads, "SmolLM2"};
    context.rope = RopeParams{c.rope_style, c.rope_theta, c.rope_scaling};
    std::unique_ptr<CompressionPolicy> policy = make(spec, context);
    LayerState state;
    state.prompt_len = n;
    ASSERT_EQ(policy->needs(state).query_moments_from, sinks) << where;
    state.n_entries = n;
    const PooledLayerKeys keys(*run.cache, 1, layer);
    state.keys = &keys;
    state.query_moments = &*run.stats.moments[size_t(layer)];
    compare_kv_heads(policy->on_prefill_end(state), entry, layer, sinks, where, nullptr, counts, disagreements);
  }
}

// KVzip: the prompt, then its scoring rows with every layer's column maxima over the sinks and the prompt (nothing
// held before it), as the step executor asks for them at the first compression point.
struct KvzipRun {
  std::unique_ptr<KvCache> cache;
  AttentionStats stats;
};
KvzipRun kvzip_run(const std::vector<int32_t>& ids, const std::vector<int32_t>& scoring, int sinks) {
  const ModelConfig& c = test::smollm2().model->config();
  const int n = int(ids.size());
  KvzipRun run{std::make_unique<KvCache>(*test::smollm2().pool, 0, c.n_layers), {}};
  run.stats.stride = n + int(scoring.size());
  run.stats.rows_from.assign(size_t(c.n_layers), n);
  run.stats.sums.assign(size_t(c.n_layers), std::vector<float>(size_t(c.n_heads) * size_t(run.stats.stride), 0.0f));
  run.stats.maxima.assign(size_t(c.n_layers), ColumnMaxima{sinks, 0});
  std::vector<float> logits;
  const BatchSequence prompt{1, ids, 0, LogitsMode::none, nullptr};
  test::smollm2().model->forward({&prompt, 1}, *run.cache, logits);
  const BatchSequence rows{1, scoring, n, LogitsMode::none, &run.stats};
  test::smollm2().model->forward({&rows, 1}, *run.cache, logits);
  return run;
}

// Each layer's policy at the compression point n, with the scoring rows' entries after the prompt's; every KV head
// keeps the sinks and the reference's top entries, our scores (the max over the group's heads) beside its band.
void check_kvzip(const nlohmann::json& entry, const PolicySpec& spec, const KvzipRun& run, const std::string& text,
                 Counts& counts, int& disagreements) {
  const ModelConfig& c = test::smollm2().model->config();
  const int n_rows = int(entry.at("scoring_ids").size());
  const int n = run.stats.stride - n_rows;
  const int sinks = entry.at("sinks").get<int>(), group = c.n_heads / c.n_kv_heads;
  for (int layer = 0; layer < c.n_layers; ++layer) {
    const std::string where = text + " layer " + std::to_string(layer);
    PolicyContext context{layer, c.n_layers, c.n_heads, c.n_kv_heads, "SmolLM2"};
    context.prefill_chunk = n;
    std::unique_ptr<CompressionPolicy> policy = make(spec, context);
    LayerState state;
    state.prompt_len = 2 * n;  // the point is not the prompt's end
    state.compression_point = n;
    const PolicyNeeds needs = policy->needs(state);
    ASSERT_EQ(needs.prefill_rows_from, n) << where;
    ASSERT_TRUE(needs.prefill_row_maxima && needs.prefill_row_maxima->sinks == sinks) << where;
    state.n_entries = n + n_rows;
    state.scoring_rows = n_rows;
    state.column_sums = run.stats.sums[size_t(layer)].data();
    state.sums_stride = run.stats.stride;
    auto scores = [&](int g) {  // the max over the KV head's query heads
      std::vector<float> max(size_t(n), 0.0f);
      for (int h = g * group; h < (g + 1) * group; ++h) {
        for (int e = 0; e < n; ++e) max[size_t(e)] = std::max(max[size_t(e)], state.sum(h, e));
      }
      return max;
    };
    compare_kv_heads(policy->on_prefill_chunk(state), entry, layer, sinks, where, scores, counts, disagreements);
  }
}

// The reconstruction prompt Strata makes from the GGUF's tokenizer and chat template is the reference's, which
// rendered the template with jinja2.
TEST(KvzipReconstructionPrompt, IsTheReferencesTokens) {
  const std::string path = test::source_path("tests/fixtures/selections/ledger_300.json");
  std::ifstream file(path);
  ASSERT_TRUE(file) << "missing fixture " << path;
  const nlohmann::json fixture = nlohmann::json::parse(file);
  const GgufFile& gguf = *test::smollm2().gguf;
  const ReconstructionPrompt prompt =
      reconstruction_prompt(Tokenizer::from_gguf(gguf),
                            ChatTemplate::detect(gguf.get_string("tokenizer.chat_template").value_or("")));
  int checked = 0;
  for (const nlohmann::json& entry : fixture.at("policies")) {
    if (entry.at("method") != "kvzip") continue;
    EXPECT_EQ(prompt.instruction, entry.at("instruction_ids").get<std::vector<int32_t>>());
    EXPECT_EQ(prompt.answer_start, entry.at("answer_start_ids").get<std::vector<int32_t>>());
    ++checked;
  }
  EXPECT_GT(checked, 0);
}

TEST_P(SelectionReferenceTest, KeptEntriesMatchTheSpecsArithmeticOnTransformersAttention) {
  const std::string path = test::source_path("tests/fixtures/selections/" + GetParam() + ".json");
  std::ifstream file(path);
  ASSERT_TRUE(file) << "missing fixture " << path;
  const nlohmann::json fixture = nlohmann::json::parse(file);
  const std::vector<int32_t> ids = fixture.at("prompt_ids").get<std::vector<int32_t>>();
  const int n = int(ids.size());
  const ModelConfig& c = test::smollm2().model->config();
  ASSERT_EQ(fixture.at("n").get<int>(), n);
  ASSERT_EQ(fixture.at("n_layers").get<int>(), c.n_layers);
  ASSERT_EQ(fixture.at("n_heads").get<int>(), c.n_heads);
  ASSERT_EQ(fixture.at("n_kv_heads").get<int>(), c.n_kv_heads);

  std::vector<int> windows;
  for (const nlohmann::json& entry : fixture.at("policies")) {
    if (entry.contains("window") &&
        std::find(windows.begin(), windows.end(), entry.at("window").get<int>()) == windows.end()) {
      windows.push_back(entry.at("window").get<int>());
    }
  }
  const std::map<int, AttentionStats> stats = window_stats(ids, windows);  // by window
  std::map<int, MomentsRun> moments;  // by sinks, for Expected Attention
  for (const nlohmann::json& entry : fixture.at("policies")) {
    if (entry.at("method") == "expected_attention" && !moments.count(entry.at("sinks").get<int>())) {
      moments.emplace(entry.at("sinks").get<int>(), moments_run(ids, entry.at("sinks").get<int>()));
    }
  }
  std::map<int, KvzipRun> kvzip;  // by sinks
  for (const nlohmann::json& entry : fixture.at("policies")) {
    if (entry.at("method") == "kvzip" && !kvzip.count(entry.at("sinks").get<int>())) {
      const std::vector<int32_t> scoring = entry.at("scoring_ids").get<std::vector<int32_t>>();
      kvzip.emplace(entry.at("sinks").get<int>(), kvzip_run(ids, scoring, entry.at("sinks").get<int>()));
    }
  }
  Counts counts;
  int disagreements = 0, n_scored = 0, n_expected = 0, n_kvzip = 0;
  for (const nlohmann::json& entry : fixture.at("policies")) {
    const std::string text = entry.at("spec").get<std::string>();
    const PolicySpec spec = parse_policy_spec(text);
    const bool expected_attention = entry.at("method") == "expected_attention";
    const bool scored = entry.contains("window");
    const int window = scored ? entry.at("window").get<int>() : 0;
    n_scored += scored ? 1 : 0;
    if (expected_attention) {
      ++n_expected;
      check_expected_attention(entry, spec, moments.at(entry.at("sinks").get<int>()), text, counts, disagreements);
      continue;
    }
    if (entry.at("method") == "kvzip") {
      ++n_kvzip;
      check_kvzip(entry, spec, kvzip.at(entry.at("sinks").get<int>()), text, counts, disagreements);
      continue;
    }
    for (int layer = 0; layer < c.n_layers; ++layer) {
      const std::string where = GetParam() + " " + text + " layer " + std::to_string(layer);
      std::unique_ptr<CompressionPolicy> policy =
          make(spec, PolicyContext{layer, c.n_layers, c.n_heads, c.n_kv_heads, "SmolLM2"});
      LayerState state;
      state.prompt_len = n;
      const int rows_from = policy->needs(state).prefill_rows_from;
      ASSERT_EQ(rows_from, scored ? n - window : -1) << where;
      state.n_entries = n;
      if (scored) {
        state.column_sums = stats.at(window).sums[size_t(layer)].data();
        state.sums_stride = stats.at(window).stride;
      }
      const std::optional<Selection> selection = policy->on_prefill_end(state);
      ASSERT_TRUE(selection.has_value()) << where << ": kept the whole prompt";
      if (!scored) {
        ASSERT_EQ(selection->kept.size(), 1u) << where;
        const nlohmann::json ref = {{"kept", entry.at("kept")}};
        if (!compare_head(selection->kept[0], ref, {}, where, counts)) ++disagreements;
        continue;
      }
      const int keep = entry.at("keep_per_layer").at(size_t(layer)).get<int>();
      ASSERT_EQ(selection->kept.size(), size_t(c.n_kv_heads)) << where;
      for (int g = 0; g < c.n_kv_heads; ++g) {
        const std::string head = where + " KV head " + std::to_string(g);
        EXPECT_EQ(selection->kept[size_t(g)].size(), size_t(keep + window)) << head << ": budget";
        const std::vector<float> scores =
            our_scores(stats.at(window), layer, g, n, window, spec, c.n_heads, c.n_kv_heads);
        if (!compare_head(selection->kept[size_t(g)], entry.at("layers").at(size_t(layer)).at(size_t(g)), scores,
                          head, counts)) {
          ++disagreements;
        }
      }
    }
  }
  std::cout << "[ selection ] " << GetParam() << " (" << n << " tokens): " << counts.compared
            << " selections compared (" << n_scored << " SnapKV/PyramidKV configurations x " << c.n_layers
            << " layers x " << c.n_kv_heads << " KV heads + " << n_expected << " Expected Attention x "
            << c.n_layers << " x " << c.n_kv_heads << " + " << n_kvzip << " KVzip x " << c.n_layers << " x "
            << c.n_kv_heads << " + " << int(fixture.at("policies").size()) - n_scored - n_expected - n_kvzip
            << " StreamingLLM x " << c.n_layers
            << " layers), "
            << counts.exact << " exact, " << counts.near_ties << " near-ties (relative margin <= " << kNearTie
            << "), " << disagreements << " disagreements; largest relative pooled-score difference at the cuts "
            << counts.worst_score_diff << std::endl;
  EXPECT_EQ(disagreements, 0);
  EXPECT_LE(counts.near_ties, kMaxNearTieShare * counts.compared) << "too many near-ties: a systematic difference?";
}

INSTANTIATE_TEST_SUITE_P(SelectionReference, SelectionReferenceTest, ::testing::Values("ledger_300", "ledger_1000"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace strata
