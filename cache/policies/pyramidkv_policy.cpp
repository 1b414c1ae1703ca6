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
#include <stdexcept>
#include <string>

#include "cache/policies/observation_window_policy.h"
#include "cache/policies/policies.h"

namespace strata {

std::unique_ptr<CompressionPolicy> make_pyramidkv_policy(const PolicySpec& spec, const PolicyContext& context) {
  ParamReader reader(spec);
  const WindowParams p = read_window_params(reader, spec.name, 8, 7, "max");
  // An integer, as in the reference code (a // beta); the paper's ablation uses 14..20 (Table 6).
  const int beta = reader.get_int("beta", 20, 1, 1000);
  const bool exact = reader.get_choice("schedule", "official", {"official", "exact"}) == "exact";
  reader.finish();
  if (context.global_layer < 0 || context.global_layer >= context.n_layers_total) {
    throw std::invalid_argument("pyramidkv: layer " + std::to_string(context.global_layer) + " outside a model of " +
                                std::to_string(context.n_layers_total) + " layers");
  }
  // This layer's non-window budget k_l, or nullopt when the layer keeps the whole prompt: n < C (the schedule's
  // first gate), or k_l >= n - w (the bottom layer under the clamp). A fraction budget that resolves to C <= w
  // keeps the window alone in every layer (spec 9.2 leaves this open; the window rows are already summed).
  auto keep = [budget = p.budget, window = p.window, beta, exact, layer = context.global_layer,
               layers = context.n_layers_total](int prompt_len) -> std::optional<int> {
    const int capacity = budget.resolve(prompt_len);
    int k = 0;
    if (capacity > window) {
      const auto schedule = exact ? pyramid_budgets_exact(layers, prompt_len, capacity, window, beta)
                                  : pyramid_budgets_official(layers, prompt_len, capacity, window, beta);
      if (!schedule) return std::nullopt;
      k = (*schedule)[size_t(layer)];
    }
    if (k >= prompt_len - window) return std::nullopt;
    return k;
  };
  return std::make_unique<ObservationWindowPolicy>("pyramidkv", p.window, p.scoring, keep, context);
}

}  // namespace strata
