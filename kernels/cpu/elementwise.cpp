// Row-wise and element-wise ops of the CPU reference backend.
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/cpu/cpu_ops.h"

namespace strata::cpu {

void embedding(std::span<const int32_t> ids, const float* table, int64_t d, float* out) {
  for (size_t t = 0; t < ids.size(); ++t) {
    std::memcpy(out + int64_t(t) * d, table + int64_t(ids[t]) * d, sizeof(float) * d);
  }
}

void rmsnorm(const float* x, const float* w, int64_t n_rows, int64_t d, float eps, float* out) {
#pragma omp parallel for if (n_rows > 8)
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* xr = x + r * d;
    float* o = out + r * d;
    double sum_sq = 0.0;  // double: a long row of large activations must not lose the small ones
    for (int64_t i = 0; i < d; ++i) sum_sq += double(xr[i]) * xr[i];
    const float inv = 1.0f / std::sqrt(float(sum_sq / d) + eps);
    for (int64_t i = 0; i < d; ++i) o[i] = xr[i] * inv * w[i];
  }
}

void silu_mul(const float* gate, const float* up, int64_t n, float* out) {
#pragma omp parallel for if (n > 65536)
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void add(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

}  // namespace strata::cpu
