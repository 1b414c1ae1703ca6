#include "cache/policies/observation_window_policy.h"

#include <stdexcept>

namespace strata {

WindowParams read_window_params(ParamReader& reader, const std::string& policy, int default_window,
                                int default_kernel, const std::string& default_pool) {
  WindowParams p;
  p.budget = reader.get_budget("budget", Budget{128});
  p.window = reader.get_int("window", default_window, 1, 1 << 20);
  p.scoring.kernel = reader.get_int("kernel", default_kernel, 1, 1023);
  p.scoring.pooling =
      reader.get_choice("pool", default_pool, {"max", "avg"}) == "max" ? Pooling::max : Pooling::avg;
  p.scoring.reduction =
      reader.get_choice("agg", "mean", {"mean", "max"}) == "max" ? HeadReduction::max : HeadReduction::mean;
  if (p.scoring.kernel % 2 == 0) {
    throw PolicyError("kernel", policy + ": kernel: must be odd, got " + std::to_string(p.scoring.kernel));
  }
  if (p.budget.fraction == 0.0 && p.budget.tokens <= p.window) {
    throw PolicyError("budget", policy + ": budget: must exceed the window (" + std::to_string(p.window) +
                                    "), got " + std::to_string(p.budget.tokens));
  }
  return p;
}

ObservationWindowPolicy::ObservationWindowPolicy(std::string name, int window, WindowScoring scoring, KeepRule keep,
                                                 const PolicyContext& context)
    : name_(std::move(name)), window_(window), scoring_(scoring), keep_(std::move(keep)), context_(context) {}

PolicyNeeds ObservationWindowPolicy::needs(const LayerState& state) const {
  PolicyNeeds needs;
  if (state.n_generated == 0 && keep_(state.prompt_len)) {
    // The scoring rows follow the chunk from its compression point on: the window is their last w.
    const int window_end = state.scored_by_prefill_tail() ? state.point() + state.scoring_rows : state.point();
    needs.prefill_rows_from = window_end - window_;
  }
  return needs;
}

// The entries before the scoring rows are scored; the chunk's own last w stay, as the window stays at the end.
std::optional<Selection> ObservationWindowPolicy::on_prefill_chunk(const LayerState& state) {
  const std::optional<int> k = keep_(state.prompt_len);
  LayerState held = state;
  if (state.scored_by_prefill_tail()) held.n_entries -= state.scoring_rows;
  if (!k || held.n_entries - window_ <= *k) return std::nullopt;
  if (!state.column_sums) throw std::logic_error(name_ + ": on_prefill_chunk without the column sums it asked for");
  return select_top_plus_window(held, context_.n_heads, context_.n_kv_heads, window_, *k, scoring_);
}

ScoringRows ObservationWindowPolicy::prefill_scoring(int prompt_len) const {
  if (!keep_(prompt_len)) return {};
  return {ScoringSource::prompt_tail, window_};
}

std::optional<int> ObservationWindowPolicy::prefill_budget(int prompt_len) const {
  const std::optional<int> k = keep_(prompt_len);
  if (!k) return std::nullopt;
  return *k + window_;
}

std::optional<Selection> ObservationWindowPolicy::on_prefill_end(const LayerState& state) {
  const std::optional<int> k = keep_(state.prompt_len);
  if (!k) return std::nullopt;
  if (!state.column_sums) throw std::logic_error(name_ + ": on_prefill_end without the column sums it asked for");
  return select_top_plus_window(state, context_.n_heads, context_.n_kv_heads, window_, *k, scoring_);
}

}  // namespace strata
