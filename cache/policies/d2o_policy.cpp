// `d2o`: Dynamic Discriminative Operations (../shared/specs/d2o.md; paper arXiv 2406.13035). Two levels:
// - layer level: each layer keeps its own share R_l of the prompt, from a statistic of its prompt attention;
// - token level: H2O's accumulated attention with T sink tokens and a recent window decides what a layer keeps
//   (one token per KV head per decode step once the budget is reached); an evicted entry whose nearest kept key
//   is similar enough (an EMA threshold) is merged into it instead of being dropped.
//
// Parameters (defaults in brackets; spec section 6 lists the switches):
//   hh_ratio      N/P, heavy hitters (sinks included) [0.1]     recent_ratio  M/P, recent window [0.1]
//                 rho = hh_ratio + recent_ratio is the mean share of the prompt a layer keeps (spec 2.2, 4)
//   sinks         T, the first entries always kept, counted inside the heavy hitters as in the code [4]
//   layer_rule    code_softmax | paper_gate [code_softmax]: R_l = clamp(softmax_l(-sigma_l) L rho, 0.01, 1) over
//                 every layer's head-normalised variance sigma (the official code, spec 2.2), or the paper's gate
//                 on the raw variance: rho above `gate`, gate_alpha * rho at or below it (spec 1)
//   gate [100], gate_alpha [2]   paper_gate only (the paper: g = 100, alpha 2 to 4)
//   merge         true | false [true]: false drops evicted entries (H2O with sinks and the layer allocation)
//   merge_weight  code_mean | paper_softmax [code_mean] (cache/policies/d2o_merge.h)
//   ema_a, ema_b  tau <- ema_a * tau + ema_b * mean similarity [0.5, 0.5] (the code's alpha / belta)
//   exempt        code | none [code]: layers 0, 1 and L-1 keep everything, as in the code (they still publish
//                 their statistic); for another set, give those layers another policy with layer_overrides
//   evict_at      first_decode | prefill_end [first_decode]: the code evicts at the first decode step, once
//                 every layer's statistic is known; the paper during prompt encoding (spec 3)
//   gqa           kv_head (the only mode): scores, selection, matching and merging per KV head, the query heads
//                 of a group summing their probabilities. The code's q_head mode repeats K/V to every query
//                 head before caching, which multiplies the cache by H / Hkv (3 for SmolLM2, 4 for Llama-3-8B)
//                 and defeats the purpose of the method (spec 7, GQA); it is not offered.
//
// Choices where the spec leaves room (docs/compression.md, D2O):
// - The merge decision follows the code: per evicted slot e (the e-th evicted entry of each KV head), merge in
//   every head iff the mean over ALL heads of the layer of their best similarity is >= tau; tau is updated first.
// - Budgets are fixed once per request from the entry count at the first eviction (P + 1 at the first decode
//   step, P at prefill end), and enforced at every later step, also for layers whose share is clamped to 1
//   (the code lets those grow, spec 2.5 and 7).
// - Prompts shorter than sinks + 16 tokens are left alone (spec 7).
// - The merged entry keeps its own accumulated score; the evicted one's is dropped (code, spec 2.4).
//
// Across ranks (design rule 3 and 4; cache/policy_collectives.h): sigma needs the min, max and mean over all heads
// of the layer (3 all-reduces of 1-2 numbers at prefill end), the allocation every layer's sigma (one gather of
// L numbers per request, the cross-layer step), and each eviction's merge decision the per-slot mean over all
// heads (one all-reduce of evicted + 1 numbers per (sequence, layer, step)). Selection, matching and merging are
// per KV head, so rank-local.
#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "cache/policies/d2o_allocation.h"
#include "cache/policies/d2o_merge.h"
#include "cache/policies/policies.h"
#include "cache/policies/selection.h"

namespace strata {
namespace {

// A prompt shorter than sinks + this is not compressed (spec 7: "skip D2O for the request").
constexpr int kMinPromptBeyondSinks = 16;

constexpr LayerMetric kMetrics[] = {
    {"merged_tokens", "strata_kv_layer_merged_tokens_total", MetricType::counter,
     "Evicted KV entries merged into kept ones (D2O), per layer."},
};

enum class LayerRule { code_softmax, paper_gate };

struct D2oParams {
  double hh_ratio = 0.1;
  double recent_ratio = 0.1;
  int sinks = 4;
  LayerRule layer_rule = LayerRule::code_softmax;
  double gate = 100.0;
  double gate_alpha = 2.0;
  bool merge = true;
  D2oMergeWeight merge_weight = D2oMergeWeight::code_mean;
  double ema_a = 0.5;
  double ema_b = 0.5;
  bool exempt_code_layers = true;
  bool evict_at_prefill_end = false;

  double rho() const { return hh_ratio + recent_ratio; }
};

class D2oPolicy final : public CompressionPolicy {
 public:
  D2oPolicy(const D2oParams& params, const PolicyContext& context)
      : params_(params), context_(context), threshold_(params.ema_a, params.ema_b) {
    const int l = context.global_layer;
    exempt_ = params.exempt_code_layers && (l == 0 || l == 1 || l == context.n_layers_total - 1);
  }

  std::string_view name() const override { return "d2o"; }

  PolicyNeeds needs(const LayerState& state) const override {
    PolicyNeeds needs;
    if (too_short(state.prompt_len)) return needs;
    if (state.n_generated == 0) {
      needs.prefill_rows_from = 0;  // every prompt row: H2O's accumulated attention and the layer statistic
    } else {
      needs.decode_probabilities = !exempt_;
    }
    return needs;
  }

  std::optional<Selection> on_prefill_end(const LayerState& state) override {
    if (too_short(state.prompt_len)) return std::nullopt;
    require_sums(state, "on_prefill_end");
    const std::vector<double> variances = column_sum_variances(state, context_.n_heads);
    PolicyCollectives& collectives = *context_.collectives;
    if (params_.layer_rule == LayerRule::code_softmax) {
      statistic_ = d2o_code_statistic(variances, collectives);
    } else {
      statistic_ = d2o_paper_statistic(variances, collectives);
      share_ = d2o_gate_share(statistic_, params_.rho(), params_.gate, params_.gate_alpha);
    }
    if (exempt_) return std::nullopt;
    // Scores per KV head: the group's mean, which ranks as the spec's sum.
    scores_ = reduce_to_kv_heads(state.column_sums, state.sums_stride, context_.n_heads, context_.n_kv_heads,
                                 state.n_entries, HeadReduction::mean);
    if (params_.evict_at_prefill_end && !std::isnan(share_)) return evict(state);
    return std::nullopt;
  }

  bool cross_layer() const override { return params_.layer_rule == LayerRule::code_softmax; }

  double layer_statistic() const override { return statistic_; }

  std::optional<Selection> on_layer_statistics(const LayerState& state,
                                               std::span<const double> per_layer) override {
    if (too_short(state.prompt_len) || params_.layer_rule != LayerRule::code_softmax) return std::nullopt;
    if (int(per_layer.size()) != context_.n_layers_total) {
      throw std::logic_error("d2o: " + std::to_string(per_layer.size()) + " layer statistics for " +
                             std::to_string(context_.n_layers_total) + " layers");
    }
    share_ = d2o_softmax_shares(per_layer, params_.rho())[size_t(context_.global_layer)];
    if (params_.evict_at_prefill_end && !exempt_) return evict(state);
    return std::nullopt;
  }

  std::optional<Selection> on_decode_step(const LayerState& state) override {
    if (too_short(state.prompt_len) || exempt_) return std::nullopt;
    require_sums(state, "on_decode_step");
    if (std::isnan(share_)) throw std::logic_error("d2o: a decode step before the layer allocation");
    const int n = state.n_entries;
    const std::vector<std::vector<float>> step = reduce_to_kv_heads(
        state.column_sums, state.sums_stride, context_.n_heads, context_.n_kv_heads, n, HeadReduction::mean);
    for (size_t g = 0; g < scores_.size(); ++g) {
      std::vector<float>& acc = scores_[g];
      if (int(acc.size()) != n - 1) {
        throw std::logic_error("d2o: " + std::to_string(n) + " entries after a decode step, but scores for " +
                               std::to_string(acc.size()) + " before it");
      }
      for (int j = 0; j < n - 1; ++j) acc[size_t(j)] += step[g][size_t(j)];
      acc.push_back(step[g][size_t(n - 1)]);
    }
    return evict(state);
  }

  // Merging rewrites kept entries at every step, and Backend::kv_merge works on full-precision blocks only: with
  // kv_cache.dtype int8 | int4 | int2 a merging layer is never sealed and stays at full precision. Without merges (or
  // in an exempt layer) the default applies: sealed once the first decode step has decided.
  bool needs_unquantized(const LayerState& state) const override {
    const bool merges_every_step = params_.merge && !exempt_ && !too_short(state.prompt_len);
    return merges_every_step || CompressionPolicy::needs_unquantized(state);
  }

  // The budget S once fixed (the most entries the layer holds from then on), and the evicted entries merged so
  // far, per KV head like the evictions: /v1/kv_state shows both, /metrics counts the merges.
  void observe(std::vector<Observation>& out) const override {
    if (!exempt_ && budget_) out.push_back({"capacity", budget_->total()});
    if (merged_tokens_ > 0) out.push_back({"merged_tokens", merged_tokens_, ObservationKind::count});
  }

 private:
  bool too_short(int prompt_len) const { return prompt_len < params_.sinks + kMinPromptBeyondSinks; }

  void require_sums(const LayerState& state, const char* hook) const {
    if (!state.column_sums) {
      throw std::logic_error(std::string("d2o: ") + hook + " without the column sums it asked for");
    }
  }

  // Per KV head: the sinks, the top (heavy - sinks) of [sinks, n - recent) by accumulated score, and the recent
  // window; the rest is evicted, and merged where similar enough. scores_ is compacted the same way.
  std::optional<Selection> evict(const LayerState& state) {
    const int n = state.n_entries;
    if (!budget_) {
      budget_ = d2o_budget(n, share_, params_.hh_ratio, params_.recent_ratio, params_.sinks);
    }
    if (n <= budget_->total()) return std::nullopt;
    const int sinks = params_.sinks;
    const int scored_end = n - budget_->recent;  // > heavy >= sinks + 1, because n > heavy + recent
    Selection selection;
    std::vector<std::vector<int32_t>> evicted;
    for (std::vector<float>& acc : scores_) {
      std::vector<int32_t> kept(static_cast<size_t>(sinks));
      std::iota(kept.begin(), kept.end(), 0);
      for (int32_t e : top_k(std::span<const float>(acc).subspan(size_t(sinks), size_t(scored_end - sinks)),
                             budget_->heavy - sinks)) {
        kept.push_back(e + sinks);
      }
      for (int e = scored_end; e < n; ++e) kept.push_back(e);
      std::vector<int32_t> dropped;
      for (int e = 0, k = 0; e < n; ++e) {
        if (k < int(kept.size()) && kept[size_t(k)] == e) {
          ++k;
        } else {
          dropped.push_back(e);
        }
      }
      for (size_t i = 0; i < kept.size(); ++i) acc[i] = acc[size_t(kept[i])];
      acc.resize(kept.size());
      selection.kept.push_back(std::move(kept));
      evicted.push_back(std::move(dropped));
    }
    if (params_.merge) {
      selection.merges = merge_evicted(state, selection.kept, evicted);
      merged_tokens_ += int64_t(selection.merges[0].n_sources());  // every KV head merges the same slots
    }
    return selection;
  }

  // The code's rule (spec 2.3 step 6, 2.4): each KV head's evicted keys are matched to their nearest kept key;
  // slot e (the e-th evicted entry of every head) merges in all heads iff the mean over all heads of the layer of
  // its best similarity is >= tau, after tau has taken this eviction's mean.
  std::vector<KvMerges> merge_evicted(const LayerState& state, const std::vector<std::vector<int32_t>>& kept,
                                      const std::vector<std::vector<int32_t>>& evicted) {
    if (!state.keys) throw std::logic_error("d2o: an eviction without the layer's keys to merge with");
    const size_t n_evicted = evicted[0].size();
    std::vector<std::vector<float>> similarity(kept.size(), std::vector<float>(n_evicted));
    std::vector<std::vector<int32_t>> nearest(kept.size(), std::vector<int32_t>(n_evicted));
    // Per slot: the sum over this rank's heads of the best similarity; last: the heads counted.
    std::vector<double> slot_sums(n_evicted + 1, 0.0);
    for (size_t g = 0; g < kept.size(); ++g) {
      state.keys->nearest(int(g), evicted[g], kept[g], similarity[g], nearest[g]);
      for (size_t e = 0; e < n_evicted; ++e) slot_sums[e] += similarity[g][e];
    }
    slot_sums[n_evicted] = double(kept.size());
    context_.collectives->tp_all_reduce(slot_sums, ReduceOp::sum);
    const double n_heads_total = slot_sums[n_evicted];
    double mean = 0.0;
    for (size_t e = 0; e < n_evicted; ++e) mean += slot_sums[e] / n_heads_total;
    const double tau = threshold_.update(mean / double(n_evicted));

    std::vector<KvMerges> per_head;
    for (size_t g = 0; g < kept.size(); ++g) {
      std::vector<D2oMergeCandidate> chosen;
      for (size_t e = 0; e < n_evicted; ++e) {
        if (slot_sums[e] / n_heads_total >= tau) {
          chosen.push_back({evicted[g][e], kept[g][size_t(nearest[g][e])], similarity[g][e]});
        }
      }
      per_head.push_back(d2o_merges(chosen, params_.merge_weight));
    }
    return per_head;
  }

  D2oParams params_;
  PolicyContext context_;
  bool exempt_ = false;
  double statistic_ = std::nan("");  // this layer's sigma (code_softmax) or mean variance (paper_gate)
  double share_ = std::nan("");      // R_l, once allocated
  std::optional<D2oBudget> budget_;  // fixed at the first eviction
  D2oThreshold threshold_;
  std::vector<std::vector<float>> scores_;  // [n_kv_heads][entries], accumulated attention
  int64_t merged_tokens_ = 0;               // evicted entries merged, per KV head
};

}  // namespace

std::unique_ptr<CompressionPolicy> make_d2o_policy(const PolicySpec& spec, const PolicyContext& context) {
  if (auto it = spec.params.find("gqa"); it != spec.params.end() && it->second == "q_head") {
    throw PolicyError("gqa", "d2o: gqa: q_head is not offered: it stores the KV repeated for every query head "
                             "(H / Hkv times the memory); use kv_head");
  }
  ParamReader reader(spec);
  D2oParams params;
  params.hh_ratio = reader.get_double("hh_ratio", params.hh_ratio, 0.0, 1.0);
  params.recent_ratio = reader.get_double("recent_ratio", params.recent_ratio, 0.0, 1.0);
  params.sinks = reader.get_int("sinks", params.sinks, 0, 1 << 20);
  const bool gate = reader.get_choice("layer_rule", "code_softmax", {"code_softmax", "paper_gate"}) == "paper_gate";
  params.layer_rule = gate ? LayerRule::paper_gate : LayerRule::code_softmax;
  if (gate) {
    params.gate = reader.get_double("gate", params.gate, 0.0, 1e30);
    params.gate_alpha = reader.get_double("gate_alpha", params.gate_alpha, 1.0, 1e6);
  } else {
    for (const char* key : {"gate", "gate_alpha"}) {
      // Rejected rather than ignored: a setting that silently does nothing hides a mistake.
      if (spec.params.count(key) != 0) {
        throw PolicyError(key, std::string("d2o: ") + key + ": applies only with layer_rule=paper_gate");
      }
    }
  }
  params.merge = reader.get_bool("merge", params.merge);
  params.merge_weight = reader.get_choice("merge_weight", "code_mean", {"code_mean", "paper_softmax"}) == "code_mean"
                            ? D2oMergeWeight::code_mean
                            : D2oMergeWeight::paper_softmax;
  params.ema_a = reader.get_double("ema_a", params.ema_a, 0.0, 1.0);
  params.ema_b = reader.get_double("ema_b", params.ema_b, 0.0, 1.0);
  params.exempt_code_layers = reader.get_choice("exempt", "code", {"code", "none"}) == "code";
  params.evict_at_prefill_end =
      reader.get_choice("evict_at", "first_decode", {"first_decode", "prefill_end"}) == "prefill_end";
  reader.get_choice("gqa", "kv_head", {"kv_head"});
  reader.finish();
  if (params.hh_ratio <= 0.0) throw PolicyError("hh_ratio", "d2o: hh_ratio: must be above 0");
  if (params.rho() > 1.0) {
    throw PolicyError("recent_ratio", "d2o: recent_ratio: hh_ratio + recent_ratio must be at most 1, got " +
                                          std::to_string(params.rho()));
  }
  return std::make_unique<D2oPolicy>(params, context);
}

std::span<const LayerMetric> d2o_metrics() { return kMetrics; }

}  // namespace strata
