#pragma once
// A path under the source tree (STRATA_SOURCE_DIR, defined by the build for the tests and the benchmarks that read
// the test fixtures), without gtest: bench/weight_rounding_quality.cpp reads the reference logits through it.
#include <string>

namespace strata::test {

inline std::string source_path(const std::string& relative) {
  return std::string(STRATA_SOURCE_DIR) + "/" + relative;
}

}  // namespace strata::test
