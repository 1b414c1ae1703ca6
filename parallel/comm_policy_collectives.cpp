#include "parallel/comm_policy_collectives.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "parallel/rank_grid.h"

namespace strata {

CommPolicyCollectives::CommPolicyCollectives(Comm* tp, Comm* pp, int n_layers_total)
    : tp_(tp), pp_(pp), n_layers_total_(n_layers_total) {}

void CommPolicyCollectives::tp_all_reduce(std::span<double> values, ReduceOp op) {
  if (tp_ == nullptr || tp_->size() == 1 || values.empty()) return;
  const size_t n = values.size();
  std::vector<double> all(n * size_t(tp_->size()));
  tp_->all_gather<double>(values, all);
  for (size_t i = 0; i < n; ++i) {
    double v = all[i];
    for (int r = 1; r < tp_->size(); ++r) {
      const double x = all[size_t(r) * n + i];
      v = op == ReduceOp::sum ? v + x : op == ReduceOp::min ? std::min(v, x) : std::max(v, x);
    }
    values[i] = v;
  }
}

void CommPolicyCollectives::gather_layers(std::span<double> values, int layer_begin, int layer_end) {
  if (values.size() != size_t(n_layers_total_)) {
    throw std::invalid_argument("gather_layers: " + std::to_string(values.size()) + " values for " +
                                std::to_string(n_layers_total_) + " layers");
  }
  if (pp_ == nullptr || pp_->size() == 1) return;
  const int pp = pp_->size();
  if (stage_layers(n_layers_total_, pp, pp_->rank()) != std::pair{layer_begin, layer_end}) {
    throw std::logic_error("gather_layers: layers [" + std::to_string(layer_begin) + ", " +
                           std::to_string(layer_end) + ") are not this stage's");
  }
  std::vector<double> all(values.size() * size_t(pp));
  pp_->all_gather<double>(values, all);
  for (int s = 0; s < pp; ++s) {
    const auto [begin, end] = stage_layers(n_layers_total_, pp, s);
    std::copy(all.begin() + ptrdiff_t(size_t(s) * values.size() + size_t(begin)),
              all.begin() + ptrdiff_t(size_t(s) * values.size() + size_t(end)), values.begin() + begin);
  }
}

}  // namespace strata
