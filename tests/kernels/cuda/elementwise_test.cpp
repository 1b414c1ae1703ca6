// The CUDA backend's row-wise and element-wise ops (kernels/cuda/elementwise.cu) against plain double-precision
// references written here, on random inputs. The device keeps weights in bf16, so weights are rounded to bf16
// before the reference sees them: a comparison measures the kernel's fp32 arithmetic, not the storage.
// Without a GPU every test skips itself with cuda_unavailable_reason().
#ifdef STRATA_HAVE_CUDA

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/backend.h"
#include "tests/kernels/cuda/cuda_test_support.h"

namespace strata {
namespace {

using test::bf16_rounded;
using test::expect_near_all;
using test::random_values;
using CudaElementwise = test::CudaTest;

// The table's rows are bf16 values, so the gathered rows are exact.
TEST_F(CudaElementwise, EmbeddingCopiesBf16RowsExactly) {
  const int64_t vocab = 101, d = 70;
  const std::vector<float> table = bf16_rounded(random_values(size_t(vocab * d), rng));
  const std::vector<int32_t> ids = {5, 0, 100, 5, 42, 99, 1};
  Tensor w = gpu->upload_weight(WeightMatrix{table.data(), WeightFormat::f32, vocab, d});
  EXPECT_EQ(w.dtype, DType::bf16);
  Tensor out = gpu->alloc(int64_t(ids.size()), d, DType::f32);
  gpu->embedding(ids, w, out);
  std::vector<float> want;
  for (int32_t id : ids) want.insert(want.end(), table.begin() + id * d, table.begin() + (id + 1) * d);
  EXPECT_EQ(host(out), want);
  const std::vector<int32_t> bad = {101};
  EXPECT_THROW(gpu->embedding(bad, w, out), std::invalid_argument);
}

// An fp32 sum of squares against the exact one: relative 1e-5 is ~100 ulps, far above the rounding error of 1,000
// terms and far below a bf16 step (2^-9 = 2e-3).
// Widths: under one warp's 4 columns a thread (576, 1000), the 1,024 threads of 8B shapes, two passes of them (70B).
TEST_F(CudaElementwise, RmsnormMatchesADoubleReference) {
  for (int64_t d : {576, 1000, 4096, 8192}) {
    const int64_t rows = 5;
    const float eps = 1e-5f;
    const std::vector<float> x = random_values(size_t(rows * d), rng, -3.0f, 3.0f);
    const std::vector<float> w = bf16_rounded(random_values(size_t(d), rng, 0.5f, 1.5f));
    Tensor xd = device(x, rows, d), out = gpu->alloc(rows, d, DType::f32);
    gpu->rmsnorm(xd, gpu->upload_weight(WeightMatrix{w.data(), WeightFormat::f32, 1, d}), eps, out);
    std::vector<double> want(x.size());
    for (int64_t r = 0; r < rows; ++r) {
      double sum_sq = 0.0;
      for (int64_t c = 0; c < d; ++c) sum_sq += double(x[size_t(r * d + c)]) * x[size_t(r * d + c)];
      const double inv = 1.0 / std::sqrt(sum_sq / double(d) + eps);
      for (int64_t c = 0; c < d; ++c) want[size_t(r * d + c)] = x[size_t(r * d + c)] * inv * w[size_t(c)];
    }
    expect_near_all(host(out), want, 1e-6f, 1e-5f, "rmsnorm d=" + std::to_string(d));
  }
  // A width the kernel's 4 columns a thread cannot cover is refused, not read past.
  const std::vector<float> x = random_values(2 * 1002, rng), w(1002, 1.0f);
  Tensor xd = device(x, 2, 1002), out = gpu->alloc(2, 1002, DType::f32);
  EXPECT_THROW(gpu->rmsnorm(xd, gpu->upload_weight(WeightMatrix{w.data(), WeightFormat::f32, 1, 1002}), 1e-5f, out),
               std::invalid_argument);
}

// silu_mul against the exact value: expf and a few fp32 roundings, within 1e-6 relative. add against the exact sum
// of the device's own inputs: one rounding.
TEST_F(CudaElementwise, SiluMulAddAndGatherRowsMatchDoubleReferences) {
  const int64_t rows = 9, cols = 1537;
  const std::vector<float> gate = random_values(size_t(rows * cols), rng, -8.0f, 8.0f);
  const std::vector<float> up = random_values(size_t(rows * cols), rng);
  Tensor g = device(gate, rows, cols), u = device(up, rows, cols), out = gpu->alloc(rows, cols, DType::f32);
  gpu->silu_mul(g, u, out);
  std::vector<double> want(gate.size());
  for (size_t i = 0; i < want.size(); ++i) want[i] = gate[i] / (1.0 + std::exp(-double(gate[i]))) * up[i];
  const std::vector<float> product = host(out);
  expect_near_all(product, want, 1e-7f, 1e-6f, "silu_mul");

  gpu->add(out, u);
  for (size_t i = 0; i < want.size(); ++i) want[i] = double(product[i]) + up[i];
  expect_near_all(host(out), want, 1e-7f, 1e-6f, "add");

  const std::vector<int64_t> pick = {8, 0, 3, 3};
  Tensor gathered = gpu->alloc(int64_t(pick.size()), cols, DType::f32);
  gpu->gather_rows(out, pick, gathered);
  const std::vector<float> all = host(out), got = host(gathered);
  for (size_t i = 0; i < pick.size(); ++i) {
    EXPECT_TRUE(std::equal(got.begin() + i * cols, got.begin() + (i + 1) * cols, all.begin() + pick[i] * cols))
        << "gathered row " << i;
  }
  const std::vector<int64_t> bad = {9};
  EXPECT_THROW(gpu->gather_rows(out, bad, gathered), std::invalid_argument);
}

}  // namespace
}  // namespace strata

#endif  // STRATA_HAVE_CUDA
