#pragma once
// Host-side helpers of the CUDA tests (tests/kernels/cuda/*_test.cpp): CUDA errors as exceptions, bf16 as the
// device stores it (so that a reference can be given exactly the numbers the device holds), random inputs,
// element-wise bounds, and the fixture that skips a test, with the reason, where no GPU is present.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"

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

inline std::vector<float> random_values(size_t n, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}
inline std::vector<float> bf16_rounded(std::vector<float> v) {
  for (float& x : v) x = round_bf16(x);
  return v;
}

// Every |got - want| <= bound[i]; on failure, the worst element.
template <class Want>
void expect_within(const std::vector<float>& got, const std::vector<Want>& want, const std::vector<float>& bound,
                   const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t worst = 0;
  double worst_excess = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double excess = std::fabs(double(got[i]) - double(want[i])) - bound[i];
    if (!(excess <= worst_excess)) {  // also catches NaN
      worst_excess = std::isnan(excess) ? INFINITY : excess;
      worst = i;
    }
  }
  EXPECT_LE(worst_excess, 0.0) << what << ": element " << worst << " is " << got[worst] << ", want " << want[worst]
                               << " within " << bound[worst];
}
template <class Want>
void expect_near_all(const std::vector<float>& got, const std::vector<Want>& want, float abs_tol, float rel_tol,
                     const std::string& what) {
  std::vector<float> bound(want.size());
  for (size_t i = 0; i < want.size(); ++i) bound[i] = abs_tol + rel_tol * float(std::fabs(want[i]));
  expect_within(got, want, bound, what);
}

// A CUDA backend on device 0 beside the CPU backend; skipped with cuda_unavailable_reason() without a GPU.
class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << cuda_unavailable_reason();
    gpu = make_cuda_backend(0);
    cpu = make_cpu_backend();
  }

  // A device f32 tensor holding `host`.
  Tensor device(const std::vector<float>& host, int64_t rows, int64_t cols) {
    Tensor t = gpu->alloc(rows, cols, DType::f32);
    gpu->copy_from_host(host.data(), t);
    return t;
  }
  std::vector<float> host(const Tensor& t) {
    std::vector<float> v(size_t(t.size()));
    gpu->copy_to_host(t, v.data());
    return v;
  }
  // A host tensor for the CPU backend over `data`.
  static Tensor on_cpu(std::vector<float>& data, int64_t rows, int64_t cols) {
    return Tensor{data.data(), DType::f32, rows, cols};
  }

  std::unique_ptr<Backend> gpu, cpu;
  std::mt19937 rng{20261122};
};

}  // namespace strata::test
