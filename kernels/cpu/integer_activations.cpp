#include "kernels/cpu/integer_activations.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "kernels/cpu/simd_clones.h"
#include "kernels/cpu/thread_pool.h"

namespace strata::cpu {
namespace {

// Rounds to the nearest integer, ties to even, for |v| < 2^22: adding 1.5 * 2^23 leaves no fraction bits in the
// sum, so the addition itself rounds (in the default rounding mode). Unlike nearbyint, this vectorizes on every
// x86-64 level (baseline SSE2 has no rounding instruction), and a row must round alike at every level.
inline float round_to_integer(float v) {
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23
  return (v + kMagic) - kMagic;
}

// The largest |q| of a block: its max |x| rounds to it.
int max_code(int digits) { return digits == 2 ? 127 * 256 : 127; }

// Row r of x into out (its buffers sized) and x_hat.
STRATA_SIMD_CLONES void round_row(const float* x, int64_t r, IntegerActivations& out, float* x_hat) {
  const int64_t cols = out.cols;
  const float steps = float(max_code(out.digits));
  for (int64_t b = 0; b < cols / 32; ++b) {
    const float* xb = x + r * cols + 32 * b;
    float amax = 0.0f;
    // std::max, not std::fmax: fmax's NaN rules made GCC call libm for every value instead of vectorizing.
#pragma omp simd reduction(max : amax)
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(xb[j]));
    const float d = amax / steps;
    const float inverse = d > 0.0f ? 1.0f / d : 0.0f;
    int32_t code[32];
    for (int j = 0; j < 32; ++j) code[j] = int32_t(round_to_integer(xb[j] * inverse));
    const int64_t at = r * out.groups * 64 + 32 * b;
    if (out.digits == 2) {
      // Three outputs that do not overlap (restrict, so that the loop vectorizes).
      int8_t* __restrict high_out = out.q.data() + at;
      int8_t* __restrict low_out = out.q_low.data() + at;
      int16_t* __restrict q16_out = out.q16.data() + at;
      for (int j = 0; j < 32; ++j) {
        const int32_t high = (code[j] + 128) >> 8;  // floor: q_low = q - 256 q_high is in [-128, 127]
        high_out[j] = int8_t(high);
        low_out[j] = int8_t(code[j] - 256 * high);
        q16_out[j] = int16_t(code[j]);
      }
    } else {
      for (int j = 0; j < 32; ++j) out.q[size_t(at + j)] = int8_t(code[j]);
    }
    int32_t half_sum[2] = {0, 0};
    for (int h = 0; h < 2; ++h) {
      for (int j = 16 * h; j < 16 * h + 16; ++j) half_sum[h] += code[j];
    }
    float* group = out.scales.data() + (r * out.groups + b / 2) * 4;
    group[b % 2] = d;
    group[2 + b % 2] = d * float(half_sum[0] + half_sum[1]);
    float* halves = out.half_sums.data() + r * (cols / 16) + 2 * b;
    halves[0] = d * float(half_sum[0]);
    halves[1] = d * float(half_sum[1]);
    if (x_hat) {
      for (int j = 0; j < 32; ++j) x_hat[r * cols + 32 * b + j] = d * float(code[j]);
    }
  }
}

}  // namespace

void round_activations(const float* x, int64_t n, int64_t cols, int digits, IntegerActivations& out, float* x_hat) {
  if (cols % 32 != 0) throw std::invalid_argument("round_activations: a row's width must be a multiple of 32");
  if (digits != 1 && digits != 2) throw std::invalid_argument("round_activations: 1 or 2 digits");
  out.rows = n;
  out.cols = cols;
  out.groups = (cols / 32 + 1) / 2;
  out.digits = digits;
  out.q.assign(size_t(n * out.groups * 64), 0);
  out.q_low.assign(digits == 2 ? size_t(n * out.groups * 64) : 0, 0);
  out.q16.assign(digits == 2 ? size_t(n * out.groups * 64) : 0, 0);
  out.scales.assign(size_t(n * out.groups * 4), 0.0f);
  out.half_sums.assign(size_t(n * (cols / 16)), 0.0f);
  // Rows on the compute pool: a prefill chunk has hundreds.
  parallel_for(n, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) round_row(x, r, out, x_hat);
  });
}

}  // namespace strata::cpu
