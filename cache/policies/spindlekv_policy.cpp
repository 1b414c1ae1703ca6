// `spindlekv` (../shared/specs/spindlekv.md; docs/compression.md "SpindleKV"): at the end of the prompt each KV
// head keeps the window and its top-k_λ context tokens by window attention score, k_λ from the corrected
// PyramidKV-style schedule (cache/policies/spindlekv_budget.h); then every kept key (before RoPE) and value is
// replaced by a reference into codebooks learnt greedily per (layer, KV head) (KvCache::replace_with_codebook).
// Nothing is evicted while decoding; every new token is matched against the codebooks as it arrives.
//
// Parameters:
//   ratio        r, the target share of the prompt kept per layer on average, window included (default 0.4).
//   window       l_w = 8, always kept.      beta  0.05, the smallest per-layer context ratio.
//   key_threshold 0.98, value_threshold 0.95: cosine thresholds of the codebooks (spec Table 3).
//   normalize    causal (default): the score of context token a is divided by (l - a), as Eq. 2 prints it;
//                none: the plain window sum (SnapKV's score without pooling).
//   top          corrected (default): top layer 2 r_c - 1 in the upper regime; printed: the paper's 1 - 2 r_c.
//   codebook     on (default) | off: eviction alone (the schedule and scores of SpindleKV, no replacement).
//
// GQA: Strata keeps one list per KV head (design rule 2), so the query heads of a group average their scores
// (the spec's option (a)); the paper's unfolding (b) needs one list per query head. With one list per KV head
// every query head keeps the same tokens, so the multiplicity weights of the spec's per-KV-head codebook are all
// equal and the greedy order is Algorithm 1's on the distinct vectors.
//
// Distributed: no collective. Scores, selection and codebooks are per KV head and local to the rank that holds
// the head; the budget depends on the global layer index, the layer count and the prompt length only (spec 11).
#include <numeric>
#include <stdexcept>
#include <string>

#include "cache/policies/policies.h"
#include "cache/policies/selection.h"
#include "cache/policies/spindlekv_budget.h"

namespace strata {
namespace {

class SpindleKvPolicy final : public CompressionPolicy {
 public:
  SpindleKvPolicy(SpindleBudget budget, bool causal_normalize, std::optional<CodebookReplacement> codebook,
                  const PolicyContext& context)
      : budget_(budget), causal_(causal_normalize), codebook_(std::move(codebook)), context_(context) {}

  std::string_view name() const override { return "spindlekv"; }
  PolicyTraits traits() const override { return {.full_precision_pool = true, .codes_entries = true, .shared_keys = std::nullopt, .keeps_every_entry = false}; }

  PolicyNeeds needs(const LayerState& state) const override {
    PolicyNeeds needs;
    if (state.n_generated == 0 && keep(state.prompt_len)) needs.prefill_rows_from = state.prompt_len - budget_.window;
    return needs;
  }

  std::optional<Selection> on_prefill_end(const LayerState& state) override {
    const std::optional<int> k = keep(state.prompt_len);
    const int n = state.n_entries;
    Selection selection;
    if (k) {
      if (!state.column_sums) throw std::logic_error("spindlekv: on_prefill_end without the column sums it asked for");
      const int context = n - budget_.window;
      std::vector<std::vector<float>> scores = reduce_to_kv_heads(
          state.column_sums, state.sums_stride, context_.n_heads, context_.n_kv_heads, context, HeadReduction::mean);
      for (std::vector<float>& head : scores) {
        if (causal_) {
          for (int a = 0; a < context; ++a) head[size_t(a)] /= float(n - a);
        }
        std::vector<int32_t> kept = top_k(head, *k);
        for (int e = context; e < n; ++e) kept.push_back(e);
        selection.kept.push_back(std::move(kept));
      }
    } else {
      if (!codebook_) return std::nullopt;
      std::vector<int32_t> all(static_cast<size_t>(n));
      std::iota(all.begin(), all.end(), 0);
      selection.kept.push_back(std::move(all));
    }
    if (codebook_) {
      // Entries are prompt positions until the prompt ends (nothing is evicted before).
      selection.codebook = *codebook_;
      selection.codebook->positions = selection.kept;
    }
    return selection;
  }

  std::optional<Selection> on_decode_step(const LayerState&) override { return std::nullopt; }

 private:
  std::optional<int> keep(int prompt_len) const {
    return spindle_context_keep(context_.global_layer, context_.n_layers_total, prompt_len, budget_);
  }

  SpindleBudget budget_;
  bool causal_;
  std::optional<CodebookReplacement> codebook_;
  PolicyContext context_;
};

}  // namespace

std::unique_ptr<CompressionPolicy> make_spindlekv_policy(const PolicySpec& spec, const PolicyContext& context) {
  ParamReader reader(spec);
  SpindleBudget budget;
  budget.ratio = reader.get_double("ratio", 0.4, 1e-6, 1.0);
  budget.window = reader.get_int("window", 8, 1, 1 << 20);
  budget.beta = reader.get_double("beta", 0.05, 0.0, 0.999);
  budget.printed_top = reader.get_choice("top", "corrected", {"corrected", "printed"}) == "printed";
  const bool causal = reader.get_choice("normalize", "causal", {"causal", "none"}) == "causal";
  CodebookReplacement codebook;
  codebook.key_threshold = float(reader.get_double("key_threshold", 0.98, -1.0, 1.0));
  codebook.value_threshold = float(reader.get_double("value_threshold", 0.95, -1.0, 1.0));
  const bool use_codebook = reader.get_choice("codebook", "on", {"on", "off"}) == "on";
  reader.finish();
  if (context.global_layer < 0 || context.global_layer >= context.n_layers_total) {
    throw std::invalid_argument("spindlekv: layer " + std::to_string(context.global_layer) + " outside a model of " +
                                std::to_string(context.n_layers_total) + " layers");
  }
  return std::make_unique<SpindleKvPolicy>(budget, causal,
                                           use_codebook ? std::optional<CodebookReplacement>(codebook) : std::nullopt,
                                           context);
}

}  // namespace strata
