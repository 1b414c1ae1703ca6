// The CUDA backend's matmul (kernels/cuda/matmul.cu) against the exact product, summed in double here, on random
// inputs: f32 weights that are bf16 numbers, and quantized weights, which go up as their dequantized values.
// Without a GPU every test skips itself with cuda_unavailable_reason().
#ifdef STRATA_HAVE_CUDA

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/backend.h"
#include "kernels/weight_format.h"
#include "tests/kernels/cuda/cuda_test_support.h"
#include "tests/kernels/random_weight_blocks.h"

namespace strata {
namespace {

using test::bf16_rounded;
using test::expect_within;
using test::random_values;
using CudaMatmul = test::CudaTest;

// out = x [t, in] * w [out, in]^T in double, and per element S = sum_k |x_k w_k|, the scale of its rounding errors.
struct ExactProduct {
  std::vector<double> out;
  std::vector<double> abs_sum;
};
ExactProduct exact_product(const std::vector<float>& x, const std::vector<float>& w, int64_t t, int64_t in,
                           int64_t out) {
  ExactProduct p{std::vector<double>(size_t(t * out)), std::vector<double>(size_t(t * out))};
  for (int64_t a = 0; a < t; ++a) {
    for (int64_t o = 0; o < out; ++o) {
      double sum = 0.0, abs_sum = 0.0;
      for (int64_t k = 0; k < in; ++k) {
        const double product = double(x[size_t(a * in + k)]) * w[size_t(o * in + k)];
        sum += product;
        abs_sum += std::fabs(product);
      }
      p.out[size_t(a * out + o)] = sum;
      p.abs_sum[size_t(a * out + o)] = abs_sum;
    }
  }
  return p;
}

// |error| <= factor * S + 1e-6 for every element.
std::vector<float> bounds(const ExactProduct& p, double factor) {
  std::vector<float> bound(p.abs_sum.size());
  for (size_t i = 0; i < bound.size(); ++i) bound[i] = float(factor * p.abs_sum[i]) + 1e-6f;
  return bound;
}

// Bounds per output element:
//   x rounded to bf16 first (what the kernel multiplies): only fp32 accumulation errs, |error| <= K 2^-24 S
//   (the worst case of any summation order; typical errors are sqrt(K) smaller);
//   x as the model gives it: cuBLAS also rounds x, one bf16 rounding per product, |error| <= 2^-9 S plus the
//   above (gemv.cu, which takes one row of x with 8k inputs, multiplies x unrounded: within the first bound).
TEST_F(CudaMatmul, MatchesTheExactProductForOddShapes) {
  struct Shape {
    int64_t t, in, out;
  };
  for (const Shape& s : {Shape{1, 576, 1536}, Shape{517, 576, 49}, Shape{517, 1000, 333}, Shape{3, 64, 7},
                         Shape{8, 4096, 100}, Shape{2, 100, 33}, Shape{9, 64, 5}}) {
    const std::string name = std::to_string(s.t) + "x" + std::to_string(s.in) + " * " + std::to_string(s.out);
    const std::vector<float> w = bf16_rounded(random_values(size_t(s.out * s.in), rng));
    const std::vector<float> x = random_values(size_t(s.t * s.in), rng, -2.0f, 2.0f);
    const std::vector<float> x_bf16 = bf16_rounded(x);
    Tensor wd = gpu->upload_weight(WeightMatrix{w.data(), WeightFormat::f32, s.out, s.in});
    Tensor out = gpu->alloc(s.t, s.out, DType::f32);
    const double accumulation = double(s.in) * std::ldexp(1.0, -24);

    const ExactProduct of_bf16_x = exact_product(x_bf16, w, s.t, s.in, s.out);
    gpu->matmul(device(x_bf16, s.t, s.in), wd, out);
    expect_within(host(out), of_bf16_x.out, bounds(of_bf16_x, accumulation), "matmul (bf16 x) " + name);

    const ExactProduct of_x = exact_product(x, w, s.t, s.in, s.out);
    gpu->matmul(device(x, s.t, s.in), wd, out);
    expect_within(host(out), of_x.out, bounds(of_x, std::ldexp(1.0, -9) + accumulation), "matmul (f32 x) " + name);
  }
  Tensor x = gpu->alloc(2, 5, DType::f32), out = gpu->alloc(2, 3, DType::f32);
  std::vector<float> w(4 * 5, 0.5f);
  EXPECT_THROW(gpu->matmul(x, gpu->upload_weight(WeightMatrix{w.data(), WeightFormat::f32, 4, 5}), out),
               std::invalid_argument);
}

// Weights that share their input, in one op: each output as the lone matmul gives it, bit for bit, for one row of
// x (gemv.cu: the three weights in one launch) and for more (one cuBLAS call each).
TEST_F(CudaMatmul, SharedInputGivesEachWeightsLoneProduct) {
  const int64_t in = 576;
  const int64_t rows[] = {7, 64, 33};
  std::vector<Tensor> weights;
  for (int64_t r : rows) {
    const std::vector<float> w = bf16_rounded(random_values(size_t(r * in), rng));
    weights.push_back(gpu->upload_weight(WeightMatrix{w.data(), WeightFormat::f32, r, in}));
  }
  for (int64_t t : {1, 5, 9}) {
    const Tensor x = device(random_values(size_t(t * in), rng), t, in);
    std::vector<Tensor> together, alone;
    for (int64_t r : rows) {
      together.push_back(gpu->alloc(t, r, DType::f32));
      alone.push_back(gpu->alloc(t, r, DType::f32));
    }
    const Tensor* w[] = {&weights[0], &weights[1], &weights[2]};
    Tensor* out[] = {&together[0], &together[1], &together[2]};
    gpu->matmul_shared_input(x, w, out);
    for (size_t i = 0; i < 3; ++i) {
      gpu->matmul(x, weights[i], alone[i]);
      EXPECT_EQ(host(together[i]), host(alone[i])) << "weight " << i << ", " << t << " rows of x";
    }
  }
}

// Quantized weights go up dequantized (on the host) and rounded to bf16: the product is the exact one over the
// dequantized values within one bf16 rounding of each weight and each input, |error| <= (2^-8 + K 2^-24) S.
TEST_F(CudaMatmul, QuantizedWeightsUploadAsTheirValues) {
  const std::pair<WeightFormat, int64_t> formats[] = {
      {WeightFormat::q8_0, 96}, {WeightFormat::q4_0, 96}, {WeightFormat::q4_1, 576}, {WeightFormat::q4_k, 512},
      {WeightFormat::q6_k, 512}};
  for (const auto& [format, cols] : formats) {
    const int64_t rows = 37, t = 3;
    const std::vector<uint8_t> blocks = test::random_blocks(format, rows, cols, 7);
    const WeightMatrix w{blocks.data(), format, rows, cols};
    const std::vector<float> x = random_values(size_t(t * cols), rng);
    std::vector<float> values(size_t(rows * cols));
    for (int64_t r = 0; r < rows; ++r) dequantize_weight_row(format, w.row(r), values.data() + r * cols, cols);
    Tensor out = gpu->alloc(t, rows, DType::f32);
    gpu->matmul(device(x, t, cols), gpu->upload_weight(w), out);
    const ExactProduct want = exact_product(x, values, t, cols, rows);
    expect_within(host(out), want.out, bounds(want, std::ldexp(1.0, -8) + double(cols) * std::ldexp(1.0, -24)),
                  "quantized upload " + std::string(weight_format_info(format).name));
  }
}

}  // namespace
}  // namespace strata

#endif  // STRATA_HAVE_CUDA
