// `h2o`: Heavy-Hitter Oracle. Each KV head keeps the `window` most recent entries plus the C - window entries with
// the highest accumulated attention (spec pyramidkv.md section 3.2).
//
// Parameters:
//   budget  C, window included (default 128); a token count or a fraction of the prompt.
//   window  recent entries always kept (default 8, as in PyramidKV's runs; spec section 4).
//   mode    one_shot (default): PyramidKV's baseline, one cut at the end of the prompt, no eviction afterwards.
//             The accumulated attention is the corrected causal form, the column sums over ALL prompt rows with the
//             full causal mask (spec 3.2: neither the window-rows variant nor the Oct-2024 unmasked one).
//           per_step: the original H2O. Every decode query's probabilities are added to the scores, and after
//             each decode step the lowest-scoring non-recent entries go until the layer holds C again.
//   agg     mean (default) | max: how a GQA group's query heads combine into their KV head (spec section 5).
// With kv_cache.prefill_compression chunked the one-shot cut also runs after every prefill chunk, over the
// attention accumulated since the prompt began (on_prefill_chunk).
// No pooling (spec 3.2). Ties follow top_k's rule (higher score, then lower index, kept), so among equal lowest
// scores the newest non-recent entry is evicted first.
#include <algorithm>
#include <span>
#include <stdexcept>

#include "cache/policies/policies.h"
#include "cache/policies/selection.h"

namespace strata {
namespace {

class H2oPolicy final : public CompressionPolicy {
 public:
  H2oPolicy(Budget budget, int window, bool per_step, HeadReduction reduction, const PolicyContext& context)
      : budget_(budget), window_(window), per_step_(per_step), reduction_(reduction), context_(context) {}

  std::string_view name() const override { return "h2o"; }
  PolicyTraits traits() const override {
    PolicyTraits t;
    t.compresses_prefill_chunks = true;
    return t;
  }
  std::optional<int> prefill_budget(int prompt_len) const override { return capacity(prompt_len); }

  PolicyNeeds needs(const LayerState& state) const override {
    PolicyNeeds needs;
    if (state.n_generated == 0) {
      // per_step needs the prompt's scores even when the prompt fits: decoding will fill the layer later.
      if (per_step_ || state.prompt_len > capacity(state.prompt_len)) needs.prefill_rows_from = 0;
    } else {
      needs.decode_probabilities = per_step_;
    }
    return needs;
  }

  std::optional<Selection> on_prefill_end(const LayerState& state) override {
    if (!per_step_ && state.n_entries <= capacity(state.prompt_len)) return std::nullopt;
    require_sums(state, "on_prefill_end");
    scores_ = reduce_to_kv_heads(state.column_sums, state.sums_stride, context_.n_heads, context_.n_kv_heads,
                                 state.n_entries, reduction_);
    std::optional<Selection> selection = evict(state, 1);
    if (!per_step_) scores_.clear();
    return selection;
  }

  // Chunked prefill: the same cut over the attention accumulated so far (the executor keeps the column sums of
  // every prompt row across chunks, over the entries kept), H2O's greedy eviction applied per chunk instead of
  // per token. The scores are taken again from the sums at the next cut.
  std::optional<Selection> on_prefill_chunk(const LayerState& state) override {
    if (state.n_entries <= capacity(state.prompt_len)) return std::nullopt;
    require_sums(state, "on_prefill_chunk");
    scores_ = reduce_to_kv_heads(state.column_sums, state.sums_stride, context_.n_heads, context_.n_kv_heads,
                                 state.n_entries, reduction_);
    std::optional<Selection> selection = evict(state, 1);
    scores_.clear();
    return selection;
  }

  std::optional<Selection> on_decode_step(const LayerState& state) override {
    if (!per_step_) return std::nullopt;
    require_sums(state, "on_decode_step");
    if (scores_.size() != size_t(context_.n_kv_heads)) {
      throw std::logic_error("h2o: a decode step before the end of the prompt");
    }
    const int n = state.n_entries;
    const std::vector<std::vector<float>> step = reduce_to_kv_heads(
        state.column_sums, state.sums_stride, context_.n_heads, context_.n_kv_heads, n, reduction_);
    for (size_t g = 0; g < scores_.size(); ++g) {
      std::vector<float>& acc = scores_[g];
      if (int(acc.size()) != n - 1) {
        throw std::logic_error("h2o: " + std::to_string(n) + " entries after a decode step, but scores for " +
                               std::to_string(acc.size()) + " before it");
      }
      for (int j = 0; j < n - 1; ++j) acc[j] += step[g][j];
      acc.push_back(step[g][n - 1]);
    }
    return evict(state, context_.decode_eviction_batch);
  }

 private:
  // The most entries the layer holds: C, or just the window when a fraction budget resolves below it (spec 9.2
  // leaves this open; the recent window is the policy's fixed part and is never cut).
  int capacity(int prompt_len) const { return std::max(budget_.resolve(prompt_len), window_); }

  // Per KV head: the top C - window of the non-recent entries by accumulated score, plus the window, once the
  // layer holds at least C + batch entries. scores_ is compacted the same way, so that index j stays the layer's
  // entry j.
  std::optional<Selection> evict(const LayerState& state, int batch) {
    const int n = state.n_entries;
    const int cap = capacity(state.prompt_len);
    if (n < cap + batch) return std::nullopt;
    const int scored = n - window_;
    Selection selection;
    for (std::vector<float>& acc : scores_) {
      std::vector<int32_t> kept = top_k(std::span<const float>(acc).first(scored), cap - window_);
      for (int j = scored; j < n; ++j) kept.push_back(j);
      for (size_t i = 0; i < kept.size(); ++i) acc[i] = acc[kept[i]];
      acc.resize(kept.size());
      selection.kept.push_back(std::move(kept));
    }
    return selection;
  }

  void require_sums(const LayerState& state, const char* hook) const {
    if (!state.column_sums) {
      throw std::logic_error(std::string("h2o: ") + hook + " without the column sums it asked for");
    }
  }

  Budget budget_;
  int window_;
  bool per_step_;
  HeadReduction reduction_;
  PolicyContext context_;
  std::vector<std::vector<float>> scores_;  // per_step: [n_kv_heads][entries], accumulated attention
};

}  // namespace

std::unique_ptr<CompressionPolicy> make_h2o_policy(const PolicySpec& spec, const PolicyContext& context) {
  ParamReader reader(spec);
  const Budget budget = reader.get_budget("budget", Budget{128});
  const int window = reader.get_int("window", 8, 0, 1 << 20);
  const bool per_step = reader.get_choice("mode", "one_shot", {"one_shot", "per_step"}) == "per_step";
  const HeadReduction reduction =
      reader.get_choice("agg", "mean", {"mean", "max"}) == "max" ? HeadReduction::max : HeadReduction::mean;
  reader.finish();
  if (budget.fraction == 0.0 && budget.tokens <= window) {
    throw PolicyError("budget", spec.name + ": budget: must exceed the window (" + std::to_string(window) +
                                    "), got " + std::to_string(budget.tokens));
  }
  return std::make_unique<H2oPolicy>(budget, window, per_step, reduction, context);
}

}  // namespace strata
