#pragma once
// What the policies of one layer on this rank did since the last report, over all its sequences: the entries
// they evicted, and the counts their observations add up to (cache/observation.h): the growth of each count a
// policy reports, and each verdict once, under `<name>=true` or `<name>=false`.
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "cache/observation.h"

namespace strata {

struct LayerCompressionCounts {
  int64_t evicted_tokens = 0;
  std::map<std::string, int64_t, std::less<>> observed;  // by the names the report carries

  // Adds what one policy reports now beyond what it reported at the previous count (`before`; empty for a
  // policy just built).
  void add_growth(std::span<const Observation> before, std::span<const Observation> now);
  // The counts that are not 0, as the report carries them.
  std::vector<Observation> observations() const;
};

}  // namespace strata
