#pragma once
// The value of one named observation (cache/observation.h) in a list, or in what a policy reports now: how the
// tests of the cache, the ranks and the leader read a policy's verdicts, bounds and counts.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "cache/compression_policy.h"
#include "cache/observation.h"

namespace strata::test {

// nullopt when none has that name.
inline std::optional<int64_t> observed(std::span<const Observation> observations, std::string_view name) {
  auto it = std::find_if(observations.begin(), observations.end(),
                         [name](const Observation& o) { return o.name == name; });
  return it == observations.end() ? std::nullopt : std::optional<int64_t>(it->value);
}

inline std::optional<int64_t> observed(const CompressionPolicy& policy, std::string_view name) {
  std::vector<Observation> observations;
  policy.observe(observations);
  return observed(observations, name);
}

// A verdict the policy reports under `name`: nullopt before it is taken.
inline std::optional<bool> verdict(const CompressionPolicy& policy, std::string_view name) {
  const std::optional<int64_t> value = observed(policy, name);
  return value ? std::optional<bool>(*value != 0) : std::nullopt;
}

}  // namespace strata::test
