#pragma once
// Weight blocks for the kernel benchmarks (bench/quantized_matmul_paths.cpp, bench/integer_product_peak.cpp): valid
// blocks of a format with every value bit random and the scales set to 2^-7 (f16 0x2000), so that timings do not
// depend on values.
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/weight_format.h"

namespace strata::bench {

inline std::vector<uint8_t> random_weight_blocks(WeightFormat format, int64_t rows, int64_t cols, std::mt19937& rng) {
  const WeightFormatInfo& info = weight_format_info(format);
  std::vector<uint8_t> data(size_t(rows * cols / info.block_elements * info.block_bytes));
  for (uint8_t& b : data) b = uint8_t(rng());
  const uint16_t scale = 0x2000;
  for (size_t at = 0; at < data.size(); at += size_t(info.block_bytes)) {
    if (format == WeightFormat::q6_k) {  // its d is last
      std::memcpy(&data[at + 208], &scale, 2);
      continue;
    }
    std::memcpy(&data[at], &scale, 2);
    if (format == WeightFormat::q4_1 || format == WeightFormat::q5_1 || format == WeightFormat::q4_k ||
        format == WeightFormat::q5_k) {
      std::memcpy(&data[at + 2], &scale, 2);
    }
  }
  return data;
}

}  // namespace strata::bench
