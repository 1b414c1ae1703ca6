#pragma once
// Host-side helpers of the CUDA tests (tests/kernels/cuda_*_test.cpp): CUDA errors as exceptions, and bf16 as the
// device stores it, so that a CPU reference can be given exactly the numbers the device holds.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

namespace strata::test {

inline void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// f32 -> bf16 bits, round to nearest even (the tests have no NaNs), and the exact widening back.
inline uint16_t bf16_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
inline float bf16_value(uint16_t bits) {
  const uint32_t u = uint32_t(bits) << 16;
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}
inline float round_bf16(float x) { return bf16_value(bf16_bits(x)); }

}  // namespace strata::test
