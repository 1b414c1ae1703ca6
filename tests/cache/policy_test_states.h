#pragma once
// LayerStates for policy tests, built by hand.
#include <vector>

#include "cache/compression_policy.h"

namespace strata::test {

// When a sequence starts: only the prompt length is known.
inline LayerState start(int prompt_len) {
  LayerState s;
  s.prompt_len = prompt_len;
  return s;
}

// At the end of a prompt of n tokens. sums: [n_heads][n], row-major; an empty vector gives no statistics.
inline LayerState prompt_end(int n, const std::vector<float>& sums) {
  LayerState s;
  s.prompt_len = n;
  s.n_entries = n;
  s.column_sums = sums.empty() ? nullptr : sums.data();
  s.sums_stride = n;
  return s;
}

}  // namespace strata::test
