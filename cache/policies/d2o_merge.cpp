#include "cache/policies/d2o_merge.h"

#include <cmath>
#include <map>
#include <vector>

namespace strata {

KvMerges d2o_merges(std::span<const D2oMergeCandidate> chosen, D2oMergeWeight rule) {
  std::map<int32_t, std::vector<const D2oMergeCandidate*>> by_target;
  for (const D2oMergeCandidate& c : chosen) by_target[c.target].push_back(&c);
  KvMerges merges;
  for (const auto& [target, group] : by_target) {
    std::vector<int32_t> sources;
    std::vector<float> weights;
    double denominator = 0.0;
    if (rule == D2oMergeWeight::code_mean) {
      denominator = 1.0 + double(group.size());
      for (const D2oMergeCandidate* c : group) weights.push_back(float(c->similarity / denominator));
    } else {
      denominator = std::exp(1.0);
      for (const D2oMergeCandidate* c : group) denominator += std::exp(double(c->similarity));
      for (const D2oMergeCandidate* c : group) weights.push_back(float(std::exp(double(c->similarity)) / denominator));
    }
    for (const D2oMergeCandidate* c : group) sources.push_back(c->evicted);
    const double self = rule == D2oMergeWeight::code_mean ? 1.0 : std::exp(1.0);
    merges.add(target, float(self / denominator), sources, weights);
  }
  return merges;
}

}  // namespace strata
