// `kvzip`: each KV head keeps the entries that the model attends to most when it is asked to repeat its context and
// fed the context again (Kim et al., 2025, "KVzip: Query-Agnostic KV Cache Compression with Context
// Reconstruction"; NVIDIA kvpress's KVzipPress). The reconstruction asks nothing about a question, so a decision
// depends on the prefix alone and a compressed document serves any question ([shared-compressed],
// docs/decisions.md).
//
// With chunked prefill only (kv_cache.prefill_compression: chunked; end mode refuses it): at each compression point
// P the chunk [P - c, P) is reconstructed. Its scoring rows, instruction + chunk[:8] + answer start + chunk
// (cache/scoring_tokens.h), run after it, and every query head h scores each entry e of the sinks and the chunk by
//   s_h(e) = max over the scoring rows r of p_r(e) / (sum of p_r over the sinks, the chunk and the rows r sees),
// the attention renormalized over what kvpress's KVzipPress scores a chunk against (its sinks, the chunk and the
// repeated chunk; kernels/column_maxima.h). A KV head scores by the max over its query heads, as KVzipPress. An
// entry's score is fixed by its own chunk's reconstruction, so keeping the top C - sinks after every chunk keeps
// what one cut of all the chunks' scores at the end would. The sinks are always kept. Nothing is evicted while
// decoding. Every KV head keeps the same count (design rule 2), where KVzipPress lets the heads of a layer differ.
//
// As Expected Attention's, a fractional budget resolves against the compression point, and the prompt's end is not
// a compression point: the tokens after the last multiple of kv_cache.prefill_chunk stay whole.
//
// Parameters:
//   budget  C, sinks included (default 128); a token count or a fraction of the prefix at the compression point.
//   sinks   default 4: the first entries, always kept (KVzipPress's n_sink).
// A prompt of n <= C keeps everything.
#include <algorithm>
#include <stdexcept>
#include <vector>

#include "cache/policies/policies.h"
#include "cache/policies/selection.h"

namespace strata {
namespace {

class KvzipPolicy final : public CompressionPolicy {
 public:
  KvzipPolicy(Budget budget, int sinks, const PolicyContext& context)
      : budget_(budget), sinks_(sinks), context_(context), scores_(size_t(context.n_kv_heads)) {}

  std::string_view name() const override { return "kvzip"; }
  PolicyTraits traits() const override {
    PolicyTraits t;
    t.compresses_prefill_chunks = true;
    t.reads_column_maxima = true;
    t.needs_chunked_prefill = true;
    return t;
  }
  // The scoring rows follow the chunk, from the compression point on; their attention is renormalized over the
  // sinks and the entries from the chunk's first on.
  PolicyNeeds needs(const LayerState& state) const override {
    PolicyNeeds n;
    if (state.n_generated == 0 && context_.prefill_chunk > 0) {
      n.prefill_rows_from = state.point();
      n.prefill_row_maxima = ColumnMaxima{sinks_, held()};
    }
    return n;
  }
  std::optional<Selection> on_prefill_end(const LayerState&) override { return std::nullopt; }
  std::optional<Selection> on_prefill_chunk(const LayerState& state) override;
  std::optional<Selection> on_decode_step(const LayerState&) override { return std::nullopt; }
  std::optional<int> prefill_budget(int prompt_len) const override { return budget_at(prompt_len); }
  ScoringRows prefill_scoring(int /*prompt_len*/) const override { return {ScoringSource::chunk_reconstruction, 0}; }
  std::optional<int> entries_after_point(int point) const override {
    return entries_after_chunked_points(point, context_.prefill_chunk, [this](int p) { return budget_at(p); });
  }

 private:
  int budget_at(int point) const { return std::max(budget_.resolve(point), sinks_); }
  int held() const { return int(scores_[0].size()); }  // entries held since the last compression point

  Budget budget_;
  int sinks_;
  PolicyContext context_;
  std::vector<std::vector<float>> scores_;  // per KV head: the score of every entry held, in entry order
};

std::optional<Selection> KvzipPolicy::on_prefill_chunk(const LayerState& state) {
  if (!state.column_sums) throw std::logic_error("kvzip: on_prefill_chunk without the column maxima it asked for");
  if (state.scoring_rows == 0) throw std::logic_error("kvzip: a compression point without its scoring rows");
  const int n = state.n_entries - state.scoring_rows;
  const int group = context_.n_heads / context_.n_kv_heads, first_new = held();
  for (int g = 0; g < context_.n_kv_heads; ++g) {
    for (int e = first_new; e < n; ++e) {
      float score = 0.0f;
      for (int h = g * group; h < (g + 1) * group; ++h) score = std::max(score, state.sum(h, e));
      scores_[size_t(g)].push_back(score);
    }
  }
  const int budget = budget_at(state.point());
  if (n <= budget) return std::nullopt;
  Selection keep;
  for (std::vector<float>& head : scores_) {
    std::vector<int32_t> kept;
    for (int e = 0; e < sinks_; ++e) kept.push_back(e);
    for (int32_t e : top_k(std::span(head).subspan(size_t(sinks_)), budget - sinks_)) kept.push_back(sinks_ + e);
    std::vector<float> kept_scores;
    for (int32_t e : kept) kept_scores.push_back(head[size_t(e)]);
    head = std::move(kept_scores);
    keep.kept.push_back(std::move(kept));
  }
  return keep;
}

}  // namespace

std::unique_ptr<CompressionPolicy> make_kvzip_policy(const PolicySpec& spec, const PolicyContext& context) {
  ParamReader reader(spec);
  const Budget budget = reader.get_budget("budget", Budget{128});
  const int sinks = reader.get_int("sinks", 4, 0, 1 << 20);
  reader.finish();
  if (budget.fraction == 0.0 && budget.tokens <= sinks) {
    throw PolicyError("budget", spec.name + ": budget: must exceed sinks (" + std::to_string(sinks) + "), got " +
                                    std::to_string(budget.tokens));
  }
  return std::make_unique<KvzipPolicy>(budget, sinks, context);
}

}  // namespace strata
