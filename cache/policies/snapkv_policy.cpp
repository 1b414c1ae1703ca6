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
#include <stdexcept>

#include "cache/policies/policies.h"
#include "cache/policies/selection.h"

namespace strata {
namespace {

class SnapKvPolicy final : public CompressionPolicy {
 public:
  SnapKvPolicy(Budget budget, int window, WindowScoring scoring, const PolicyContext& context)
      : budget_(budget), window_(window), scoring_(scoring), context_(context) {}

  std::string_view name() const override { return "snapkv"; }

  PolicyNeeds needs(const LayerState& state) const override {
    PolicyNeeds needs;
    if (state.n_generated == 0 && compresses(state.prompt_len)) needs.prefill_rows_from = state.prompt_len - window_;
    return needs;
  }

  std::optional<Selection> on_prefill_end(const LayerState& state) override {
    if (!compresses(state.prompt_len)) return std::nullopt;
    if (!state.column_sums) throw std::logic_error("snapkv: on_prefill_end without the column sums it asked for");
    return select_top_plus_window(state, context_.n_heads, context_.n_kv_heads, window_, keep(state.prompt_len),
                                  scoring_);
  }

  std::optional<Selection> on_decode_step(const LayerState&) override { return std::nullopt; }

 private:
  // Non-window entries kept: C - w. A fraction budget that resolves to C <= w keeps the window alone (spec 9.2
  // leaves this open; the window rows are already summed, so the window is not shrunk after the fact).
  int keep(int prompt_len) const { return std::max(0, budget_.resolve(prompt_len) - window_); }
  bool compresses(int prompt_len) const { return keep(prompt_len) < prompt_len - window_; }

  Budget budget_;
  int window_;
  WindowScoring scoring_;
  PolicyContext context_;
};

}  // namespace

std::unique_ptr<CompressionPolicy> make_snapkv_policy(const PolicySpec& spec, const PolicyContext& context) {
  ParamReader reader(spec);
  const bool runs = reader.get_choice("mode", "code", {"code", "pyramidkv_runs"}) == "pyramidkv_runs";
  const Budget budget = reader.get_budget("budget", Budget{128});
  const int window = reader.get_int("window", runs ? 8 : 32, 1, 1 << 20);
  WindowScoring scoring;
  scoring.kernel = reader.get_int("kernel", runs ? 7 : 5, 1, 1023);
  scoring.pooling = reader.get_choice("pool", runs ? "max" : "avg", {"max", "avg"}) == "max" ? Pooling::max
                                                                                             : Pooling::avg;
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
  return std::make_unique<SnapKvPolicy>(budget, window, scoring, context);
}

}  // namespace strata
