#pragma once
// Activation rows rounded to integers per block of 32 values, for engine.activation_dtype int8 and int16, held as
// int8 digits that the integer kernels (kernels/cpu/quantized_dot.h) multiply with the weights' unsigned codes:
//   int8   d = max |x| / 127 over the block, q = round(x / d), one digit (the idea of llama.cpp's Q8_1 blocks);
//   int16  d = max |x| / 32512 (127 x 256), q = round(x / d), two digits q = 256 q_high + q_low with q_high in
//          [-127, 127] and q_low in [-128, 127], so that the weights are multiplied with each as int8 and the sums
//          recombine exactly in 32 bits (splitting a wider integer into int8 slices for int8 products is the idea
//          of the Ozaki scheme, Ootomo et al. 2024). Its rounding error is 1/256 of int8's.
// The block stands for d * q. A pair group of the weights (kernels/cpu/packed_weight.h) then contributes
//   d_w0 d0 (u . q)_0 + d_w1 d1 (u . q)_1 + m_w0 s0 + m_w1 s1,   s = d * sum(q) per block,
// which is the dot product with the rounded values d * q, up to the order of the sums.
#include <cstdint>
#include <vector>

namespace strata::cpu {

struct IntegerActivations {
  int64_t rows = 0;
  int64_t cols = 0;               // a multiple of 32
  int64_t groups = 0;             // pair groups of 64 values per row (a lone last block of 32 rounds up)
  int digits = 1;                 // 1 (int8) or 2 (int16)
  std::vector<int8_t> q;          // [rows][groups * 64]: q, or q_high with two digits; a lone last block followed
                                  // by 32 zeros
  std::vector<int8_t> q_low;      // the same for q_low; empty with one digit
  std::vector<int16_t> q16;       // with two digits, q itself, for kernels that multiply 16-bit values (vpmaddwd:
                                  // AVX2's pair groups); empty with one digit
  std::vector<float> scales;      // [rows][groups][4]: d0, d1, s0, s1 of the group's two blocks (0 for a missing one)
  std::vector<float> half_sums;   // [rows][cols / 16]: d times the sum of q over each half of each block (Q6_K's
                                  // tiles, whose scales change every 16 values)

  const int8_t* row_values(int64_t r) const { return q.data() + r * groups * 64; }
  const int8_t* row_low_values(int64_t r) const { return q_low.data() + r * groups * 64; }
  const int16_t* row_values16(int64_t r) const { return q16.data() + r * groups * 64; }
  const float* row_scales(int64_t r) const { return scales.data() + r * groups * 4; }
  const float* row_half_sums(int64_t r) const { return half_sums.data() + r * (cols / 16); }
};

// Rounds n rows of x [n][cols] (cols a multiple of 32) to integers of `digits` int8 digits (1 or 2) into `out` (its
// buffers reused) and, where x_hat is not null, writes the values the rounding stands for, d * q, to x_hat
// [n][cols]. Ties round to even.
void round_activations(const float* x, int64_t n, int64_t cols, int digits, IntegerActivations& out, float* x_hat);

}  // namespace strata::cpu
