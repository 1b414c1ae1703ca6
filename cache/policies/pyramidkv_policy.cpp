// `pyramidkv`: SnapKV's observation-window selection (spec pyramidkv.md section 2) with a per-layer budget that
// falls linearly from the bottom layer to the top (spec 3.4). Once, at the end of the prompt; nothing is evicted
// while decoding (spec 1.2).
//
// Parameters (defaults are PyramidKV's LongBench runs, spec section 4):
//   budget    C, the AVERAGE per layer, window included (default 128); a token count or a fraction of the prompt.
//   window    w = 8.   kernel  k = 7 (odd).   pool  max (default) | avg.   beta  20.
//   schedule  official (default): the reference code's integer schedule with its gates and clamp, whose total
//               exceeds L * (C - w) at small C (spec 3.4 table, 6.1), for comparing with the published numbers.
//             exact: the paper's formula with the total exactly L * (C - w) (pyramid_budgets_exact documents the
//               rounding).
//   agg       mean (default) | max: how a GQA group's query heads combine into their KV head (spec section 5).
// The budget is a function of the global layer index, the model's layer count and the prompt length only, so every
// rank computes its own layers' budgets alone (design rule 1).
#include <algorithm>
#include <stdexcept>

#include "cache/policies/policies.h"
#include "cache/policies/selection.h"

namespace strata {
namespace {

class PyramidKvPolicy final : public CompressionPolicy {
 public:
  PyramidKvPolicy(Budget budget, int window, int beta, bool exact, WindowScoring scoring,
                  const PolicyContext& context)
      : budget_(budget), window_(window), beta_(beta), exact_(exact), scoring_(scoring), context_(context) {}

  std::string_view name() const override { return "pyramidkv"; }

  PolicyNeeds needs(const LayerState& state) const override {
    PolicyNeeds needs;
    if (state.n_generated == 0 && keep(state.prompt_len)) needs.prefill_rows_from = state.prompt_len - window_;
    return needs;
  }

  std::optional<Selection> on_prefill_end(const LayerState& state) override {
    const std::optional<int> k = keep(state.prompt_len);
    if (!k) return std::nullopt;
    if (!state.column_sums) throw std::logic_error("pyramidkv: on_prefill_end without the column sums it asked for");
    return select_top_plus_window(state, context_.n_heads, context_.n_kv_heads, window_, *k, scoring_);
  }

  std::optional<Selection> on_decode_step(const LayerState&) override { return std::nullopt; }

 private:
  // This layer's non-window budget k_l, or nullopt when the layer keeps the whole prompt: n < C (the schedule's
  // first gate), or k_l >= n - w (the bottom layer under the clamp). A fraction budget that resolves to C <= w
  // keeps the window alone in every layer (spec 9.2 leaves this open; the window rows are already summed).
  std::optional<int> keep(int prompt_len) const {
    const int capacity = budget_.resolve(prompt_len);
    std::optional<int> k = 0;
    if (capacity > window_) {
      const int layers = context_.n_layers_total;
      const auto schedule = exact_ ? pyramid_budgets_exact(layers, prompt_len, capacity, window_, beta_)
                                   : pyramid_budgets_official(layers, prompt_len, capacity, window_, beta_);
      if (!schedule) return std::nullopt;
      k = (*schedule)[context_.global_layer];
    }
    if (*k >= prompt_len - window_) return std::nullopt;
    return k;
  }

  Budget budget_;
  int window_;
  int beta_;
  bool exact_;
  WindowScoring scoring_;
  PolicyContext context_;
};

}  // namespace

std::unique_ptr<CompressionPolicy> make_pyramidkv_policy(const PolicySpec& spec, const PolicyContext& context) {
  ParamReader reader(spec);
  const Budget budget = reader.get_budget("budget", Budget{128});
  const int window = reader.get_int("window", 8, 1, 1 << 20);
  WindowScoring scoring;
  scoring.kernel = reader.get_int("kernel", 7, 1, 1023);
  scoring.pooling = reader.get_choice("pool", "max", {"max", "avg"}) == "max" ? Pooling::max : Pooling::avg;
  // An integer, as in the reference code (a // beta); the paper's ablation uses 14..20 (Table 6).
  const int beta = reader.get_int("beta", 20, 1, 1000);
  const bool exact = reader.get_choice("schedule", "official", {"official", "exact"}) == "exact";
  scoring.reduction =
      reader.get_choice("agg", "mean", {"mean", "max"}) == "max" ? HeadReduction::max : HeadReduction::mean;
  reader.finish();
  if (scoring.kernel % 2 == 0) {
    throw PolicyError("kernel", spec.name + ": kernel: must be odd, got " + std::to_string(scoring.kernel));
  }
  if (budget.fraction == 0.0 && budget.tokens <= window) {
    throw PolicyError("budget", spec.name + ": budget: must exceed the window (" + std::to_string(window) +
                                    "), got " + std::to_string(budget.tokens));
  }
  if (context.global_layer < 0 || context.global_layer >= context.n_layers_total) {
    throw std::invalid_argument("pyramidkv: layer " + std::to_string(context.global_layer) + " outside a model of " +
                                std::to_string(context.n_layers_total) + " layers");
  }
  return std::make_unique<PyramidKvPolicy>(budget, window, beta, exact, scoring, context);
}

}  // namespace strata
