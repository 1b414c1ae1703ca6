#pragma once
// Random but valid blocks of the quantized weight formats (kernels/weight_format.h), for the kernel tests of both
// backends: scales of a realistic size, every bit of the values random; f16 and bf16 values drawn from a normal.
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/weight_format.h"

namespace strata::test {

inline std::vector<uint8_t> random_blocks(WeightFormat format, int64_t rows, int64_t cols, uint32_t seed) {
  const WeightFormatInfo& info = weight_format_info(format);
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.002f, 0.05f);
  std::vector<uint8_t> data(size_t(rows * cols / info.block_elements * info.block_bytes));
  for (uint8_t& b : data) b = uint8_t(byte(rng));
  auto put_f16 = [](uint8_t* p, float v) {
    const uint16_t h = fp32_to_fp16(v);
    std::memcpy(p, &h, 2);
  };
  if (format == WeightFormat::f16 || format == WeightFormat::bf16) {  // finite values of a weight's size
    std::normal_distribution<float> normal(0.0f, 0.05f);
    for (size_t at = 0; at < data.size(); at += 2) {
      const float v = normal(rng);
      const uint16_t h = format == WeightFormat::f16 ? fp32_to_fp16(v) : fp32_to_bf16(v);
      std::memcpy(&data[at], &h, 2);
    }
    return data;
  }
  for (size_t at = 0; at < data.size(); at += size_t(info.block_bytes)) {
    uint8_t* b = data.data() + at;
    switch (format) {
      case WeightFormat::q8_0: put_f16(b, scale(rng)); break;
      case WeightFormat::q4_0: put_f16(b, scale(rng)); break;
      case WeightFormat::q4_1: put_f16(b, scale(rng)), put_f16(b + 2, -8.0f * scale(rng)); break;
      case WeightFormat::q5_1: put_f16(b, scale(rng) / 2), put_f16(b + 2, -8.0f * scale(rng)); break;
      case WeightFormat::q4_k: put_f16(b, scale(rng) / 16), put_f16(b + 2, scale(rng) / 16); break;
      case WeightFormat::q5_k: put_f16(b, scale(rng) / 32), put_f16(b + 2, scale(rng) / 32); break;
      case WeightFormat::q6_k:
        put_f16(b + 208, scale(rng) / 32);
        for (int s = 0; s < 16; ++s) b[192 + s] = uint8_t(int8_t(byte(rng) % 128 - 64));
        break;
      case WeightFormat::f32:
      case WeightFormat::f16:
      case WeightFormat::bf16: break;
    }
  }
  return data;
}

}  // namespace strata::test
