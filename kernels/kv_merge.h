#pragma once
// Weighted merges of cache entries into other entries of the same layer and KV head (D2O's compensation,
// ../shared/specs/d2o.md 4.2.2 and 2.3): a kept entry t becomes
//   K[t] <- target_weight * K[t] + sum_i source_weight[i] * K[source[i]]      (the same weights for V)
// Flat arrays, so that a device backend copies them in one transfer and runs one thread block per target.
#include <cstdint>
#include <vector>

namespace strata {

struct KvMerges {
  std::vector<int32_t> targets;         // entries that change, each at most once
  std::vector<float> target_weights;    // [targets.size()]: the weight of the entry's own vector
  std::vector<int32_t> source_begin;    // [targets.size() + 1]: target i's sources are [source_begin[i], source_begin[i + 1])
  std::vector<int32_t> sources;         // entries merged in; never a target (sources are read unchanged)
  std::vector<float> source_weights;    // [sources.size()]

  bool empty() const { return targets.empty(); }
  size_t n_sources() const { return sources.size(); }

  // Appends one target with its sources; `source_entries` and `weights` have the same length.
  void add(int32_t target, float target_weight, const std::vector<int32_t>& source_entries,
           const std::vector<float>& weights) {
    if (source_begin.empty()) source_begin.push_back(0);
    targets.push_back(target);
    target_weights.push_back(target_weight);
    sources.insert(sources.end(), source_entries.begin(), source_entries.end());
    source_weights.insert(source_weights.end(), weights.begin(), weights.end());
    source_begin.push_back(int32_t(sources.size()));
  }
};

}  // namespace strata
