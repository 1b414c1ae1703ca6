#include "cache/policies/d2o_allocation.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace strata {

std::vector<double> column_sum_variances(const LayerState& state, int n_heads) {
  const int n = state.n_entries;
  if (n < 2) throw std::invalid_argument("d2o: the variance of column sums needs at least 2 entries");
  std::vector<double> variances(static_cast<size_t>(n_heads));
  for (int h = 0; h < n_heads; ++h) {
    double mean = 0.0;
    for (int e = 0; e < n; ++e) mean += state.sum(h, e);
    mean /= n;
    double squares = 0.0;
    for (int e = 0; e < n; ++e) squares += (state.sum(h, e) - mean) * (state.sum(h, e) - mean);
    variances[size_t(h)] = squares / (n - 1);
  }
  return variances;
}

double d2o_code_statistic(std::span<const double> variances, PolicyCollectives& collectives) {
  double lowest = std::numeric_limits<double>::infinity();
  double highest = -std::numeric_limits<double>::infinity();
  for (double v : variances) {
    lowest = std::min(lowest, v);
    highest = std::max(highest, v);
  }
  collectives.tp_all_reduce(std::span<double>(&lowest, 1), ReduceOp::min);
  collectives.tp_all_reduce(std::span<double>(&highest, 1), ReduceOp::max);
  double totals[2] = {0.0, double(variances.size())};  // sum of the normalised values, heads
  for (double v : variances) totals[0] += (v - lowest) / (highest - lowest + 1e-6);
  collectives.tp_all_reduce(totals, ReduceOp::sum);
  return totals[0] / totals[1];
}

double d2o_paper_statistic(std::span<const double> variances, PolicyCollectives& collectives) {
  double totals[2] = {0.0, double(variances.size())};
  for (double v : variances) totals[0] += v;
  collectives.tp_all_reduce(totals, ReduceOp::sum);
  return totals[0] / totals[1];
}

std::vector<double> d2o_softmax_shares(std::span<const double> sigma, double rho) {
  std::vector<double> shares(sigma.size(), std::nan(""));
  double lowest = std::numeric_limits<double>::infinity();
  int n_valid = 0;
  for (double s : sigma) {
    if (std::isnan(s)) continue;
    lowest = std::min(lowest, s);
    ++n_valid;
  }
  if (n_valid == 0) return shares;
  // softmax(-sigma), shifted by the largest -sigma for range.
  double denominator = 0.0;
  for (double s : sigma) {
    if (!std::isnan(s)) denominator += std::exp(lowest - s);
  }
  for (size_t l = 0; l < sigma.size(); ++l) {
    if (std::isnan(sigma[l])) continue;
    const double weight = std::exp(lowest - sigma[l]) / denominator;
    shares[l] = std::clamp(weight * n_valid * rho, 0.01, 1.0);
  }
  return shares;
}

double d2o_gate_share(double statistic, double rho, double gate, double alpha) {
  return statistic > gate ? rho : std::min(alpha * rho, 1.0);
}

D2oBudget d2o_budget(int n_entries, double share, double hh_ratio, double recent_ratio, int sinks) {
  const double rho = hh_ratio + recent_ratio;
  // The slack keeps a product that is an integer on paper from flooring one below it: with share 1,
  // 18 * 0.4 / (0.4 + 0.2) is 11.999999999999998 in doubles.
  const auto floor_of = [](double x) { return int(std::floor(x + 1e-9)); };
  D2oBudget budget;
  budget.heavy = std::max(floor_of(n_entries * (share * hh_ratio / rho)), sinks + 1);
  budget.recent = floor_of(n_entries * (share * recent_ratio / rho));
  return budget;
}

}  // namespace strata
