// `snapkv`: each KV head keeps the C - w prompt entries that the last w prompt queries (the observation window)
// attend to most, after pooling, plus the window itself; once, at the end of the prompt (spec pyramidkv.md
// sections 2 and 3.3). Nothing is evicted while decoding (spec 1.2).
//
// Parameters:
//   mode    code (default): SnapKV's official defaults, w = 32, k = 5, avg pooling (spec 3.3).
//           pyramidkv_runs: the settings PyramidKV's LongBench runs used for SnapKV, w = 8, k = 7, max pooling.
//   window, kernel, pool=max|avg: override the mode's value one by one. kernel must be odd (spec 2, step 5).
//   budget  C, window included (default 128, the daemon's common default, rather than the official init's 2048,
//           so that policies compare at equal memory unless told otherwise); a token count or a fraction.
//   agg     mean (default) | max: how a GQA group's query heads combine into their KV head (spec section 5).
// A prompt of n <= C keeps everything (spec 1.4; at n == C the selection would keep all anyway).
#include <algorithm>

#include "cache/policies/observation_window_policy.h"
#include "cache/policies/policies.h"

namespace strata {

std::unique_ptr<CompressionPolicy> make_snapkv_policy(const PolicySpec& spec, const PolicyContext& context) {
  ParamReader reader(spec);
  const bool runs = reader.get_choice("mode", "code", {"code", "pyramidkv_runs"}) == "pyramidkv_runs";
  const WindowParams p = read_window_params(reader, spec.name, runs ? 8 : 32, runs ? 7 : 5, runs ? "max" : "avg");
  reader.finish();
  // Non-window entries kept: C - w, the same in every layer. A fraction budget that resolves to C <= w keeps the
  // window alone (spec 9.2 leaves this open; the window rows are already summed, so the window is not shrunk).
  auto keep = [budget = p.budget, window = p.window](int prompt_len) -> std::optional<int> {
    const int k = std::max(0, budget.resolve(prompt_len) - window);
    if (k >= prompt_len - window) return std::nullopt;
    return k;
  };
  return std::make_unique<ObservationWindowPolicy>("snapkv", p.window, p.scoring, keep, context);
}

}  // namespace strata
