// Row-wise and element-wise ops of the CPU reference backend.
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/fast_exp.h"
#include "kernels/cpu/simd_clones.h"
#include "kernels/cpu/thread_pool.h"

namespace strata::cpu {

void embedding(std::span<const int32_t> ids, const float* table, int64_t d, float* out) {
  for (size_t t = 0; t < ids.size(); ++t) {
    std::memcpy(out + int64_t(t) * d, table + int64_t(ids[t]) * d, sizeof(float) * d);
  }
}

void rmsnorm(const float* x, const float* w, int64_t n_rows, int64_t d, float eps, float* out) {
  parallel_for(n_rows, 8, [&](int64_t begin, int64_t end) {  // a decode step's few rows: one chunk
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = x + r * d;
      float* o = out + r * d;
      double sum_sq = 0.0;  // double: a long row of large activations must not lose the small ones
      for (int64_t i = 0; i < d; ++i) sum_sq += double(xr[i]) * xr[i];
      const float inv = 1.0f / std::sqrt(float(sum_sq / d) + eps);
      for (int64_t i = 0; i < d; ++i) o[i] = xr[i] * inv * w[i];
    }
  });
}

namespace {

// silu(g) * u with e = exp(-|g|) <= 1, so that exp never overflows: g / (1 + e) for g >= 0, g e / (1 + e) below.
// The factor (e or 1) is chosen with a mask made of the sign bit, not a compare: with one, GCC turned the choice
// into a branch and left the loop scalar below AVX-512.
STRATA_SIMD_CLONES
void silu_mul_range(const float* gate, const float* up, int64_t n, float* out) {
  const uint32_t one = std::bit_cast<uint32_t>(1.0f);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    const uint32_t bits = std::bit_cast<uint32_t>(g);
    const float e = exp_nonpositive(std::bit_cast<float>(bits | 0x80000000u));
    const uint32_t negative = uint32_t(int32_t(bits) >> 31);  // all ones for a negative gate
    const float factor = std::bit_cast<float>((std::bit_cast<uint32_t>(e) & negative) | (one & ~negative));
    out[i] = g * factor / (1.0f + e) * up[i];
  }
}

}  // namespace

void silu_mul(const float* gate, const float* up, int64_t n, float* out) {
  parallel_for(n, 65536, [&](int64_t begin, int64_t end) {
    silu_mul_range(gate + begin, up + begin, end - begin, out + begin);
  });
}

void add(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

}  // namespace strata::cpu
