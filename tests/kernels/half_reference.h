#pragma once
// IEEE half and bfloat16 conversions written apart from the code under test (kernels/weight_format.h): half through
// the compiler's _Float16, bfloat16 as fp32's top half, rounded to nearest even on the 16 bits cut.
#include <cstdint>
#include <cstring>

#include "kernels/tensor.h"

namespace strata::test {

// x rounded to nearest even in `dtype` (f16 or bf16), as its 16 bits.
inline uint16_t round_to_half(float x, DType dtype) {
  uint16_t out;
  if (dtype == DType::f16) {
    const _Float16 h = static_cast<_Float16>(x);
    std::memcpy(&out, &h, sizeof out);
    return out;
  }
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return uint16_t((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
}

// The value of 16 bits of `dtype`.
inline float widen_half(uint16_t bits, DType dtype) {
  if (dtype == DType::f16) {
    _Float16 x;
    std::memcpy(&x, &bits, sizeof x);
    return float(x);
  }
  const uint32_t wide = uint32_t(bits) << 16;
  float x;
  std::memcpy(&x, &wide, sizeof x);
  return x;
}

}  // namespace strata::test
