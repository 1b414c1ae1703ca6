#pragma once
// D2O's layer level (../shared/specs/d2o.md sections 1, 2.1, 2.2): a statistic per layer from its prompt
// attention, and from the statistics the share of the prompt each layer keeps. Pure functions, except that the
// averages over heads go through PolicyCollectives (design rule 3: one small all-reduce over the TP group).
//
// Notation: P the prompt, rho = hh_ratio + recent_ratio, R_l the share of its entries layer l keeps.
#include <span>
#include <vector>

#include "cache/compression_policy.h"
#include "cache/policy_collectives.h"

namespace strata {

// Unbiased variance over the entries [0, state.n_entries) of each query head's column sums: [n_heads]. The
// column sums are over all prompt rows, so this is Var_j(c_j) of spec 1 per head (torch.var's default, as the
// code). Requires n_entries >= 2.
std::vector<double> column_sum_variances(const LayerState& state, int n_heads);

// The official code's statistic (spec 2.1): sigma = mean_h (v_h - min_h v) / (max_h v - min_h v + 1e-6), over
// ALL query heads of the layer: min, max and the sum of the normalised values are all-reduced over the TP group.
// In [0, 1).
double d2o_code_statistic(std::span<const double> variances, PolicyCollectives& collectives);

// The paper's density metric (spec 1, Eq. 4): the variance on raw scale, averaged over all query heads of the
// layer (the paper does not say how heads combine; its Fig. 1 averages them). One all-reduce of two numbers.
double d2o_paper_statistic(std::span<const double> variances, PolicyCollectives& collectives);

// The official allocation (spec 2.2): w = softmax_l(-sigma_l), R_l = clamp(w_l * L' * rho, 0.01, 1), over the
// L' layers whose sigma is a number; NaN elsewhere (layers whose policy publishes no statistic). Lower sigma, a
// bigger share; before the clamp the mean share is rho.
std::vector<double> d2o_softmax_shares(std::span<const double> sigma, double rho);

// The paper's gate (spec 1): a sparse layer (statistic > gate) keeps rho, a dense one alpha * rho, at most 1.
double d2o_gate_share(double statistic, double rho, double gate, double alpha);

// How many entries a layer keeps: `heavy` by accumulated attention (the sinks among them) and `recent`, fixed
// once per request from the entry count n at the first eviction (spec 2.3, step 3).
struct D2oBudget {
  int heavy = 0;
  int recent = 0;
  int total() const { return heavy + recent; }
};

// heavy = max(floor(n * share * hh_ratio / rho), sinks + 1), recent = floor(n * share * recent_ratio / rho), the
// floors with 1e-9 of slack against rounding: the N:M split is kept, and at least one heavy hitter beyond the
// sinks (spec 6, the guard; spec 7).
D2oBudget d2o_budget(int n_entries, double share, double hh_ratio, double recent_ratio, int sinks);

}  // namespace strata
