#pragma once
// A random token mask (kernels/token_sampling.h) for the sampling tests of both backends.
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/token_sampling.h"

namespace strata::test {

// A mask over `cols` tokens allowing each with probability `density`, and always `always`.
inline std::vector<uint64_t> random_mask(int64_t cols, double density, int64_t always, std::mt19937& rng) {
  std::vector<uint64_t> mask(size_t(mask_words(cols)), 0);
  std::bernoulli_distribution allow(density);
  for (int64_t id = 0; id < cols; ++id) {
    if (allow(rng) || id == always) mask_set(mask, id);
  }
  return mask;
}

}  // namespace strata::test
