// Expected Attention's key forms on CUDA (kernels/cuda/kv_key_forms.cu) against the forms computed in double from
// the entries the pools hold, and against the CPU twin on the same numbers (tests/kernels/cuda/twin_pool.h): over
// a layer whose first groups are sealed (int8, int4) and whose tail is bf16, and over a long full-precision layer
// at head_dim 128 (several thread blocks, a partial last one); and the errors of a bad call.
// Without a GPU every test skips itself with cuda_unavailable_reason().
#ifdef STRATA_HAVE_CUDA

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/backend.h"
#include "kernels/kv_block_layout.h"
#include "tests/kernels/cuda/twin_pool.h"

namespace strata {
namespace {

using test::PoolReader;
using test::TwinPool;
using CudaKvKeyForms = test::CudaTest;

// Both backends' forms and norms of entries [0, n) of every KV head, each within fp32 reordering of the double
// ones: 1e-5 of the sum of the terms' magnitudes, 1e-5 of the norm.
void expect_forms_of_both(Backend& cpu, Backend& gpu, const TwinPool& pool, const std::vector<int32_t>& table, int n,
                          int m, std::mt19937& rng) {
  const KvBlockLayout& L = pool.cpu_layout;
  const int d = L.head_dim;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> linear(size_t(m) * d), quadratic(size_t(m) * d * d);
  for (float& x : linear) x = normal(rng);
  for (float& x : quadratic) x = 0.1f * normal(rng);
  const PoolReader host{pool.cpu};
  for (int head = 0; head < L.n_kv_heads; ++head) {
    std::vector<float> cpu_forms(size_t(m) * n), cpu_norms(static_cast<size_t>(n));
    std::vector<float> gpu_forms(size_t(m) * n), gpu_norms(static_cast<size_t>(n), -1.0f);
    cpu.kv_key_forms(table, head, linear, quadratic, pool.cpu, cpu_forms, cpu_norms);
    gpu.kv_key_forms(table, head, linear, quadratic, pool.gpu, gpu_forms, gpu_norms);
    int far = 0;
    for (int e = 0; e < n; ++e) {
      const int32_t block = table[size_t(e / L.block_size)];
      const int slot = e % L.block_size;
      std::vector<double> k(static_cast<size_t>(d));
      double v2 = 0.0;
      for (int c = 0; c < d; ++c) {
        k[size_t(c)] = host.at(block, true, head, slot, c);
        const double v = host.at(block, false, head, slot, c);
        v2 += v * v;
      }
      const double norm = std::sqrt(v2);
      far += std::fabs(gpu_norms[size_t(e)] - norm) > 1e-5 * norm;
      far += std::fabs(cpu_norms[size_t(e)] - norm) > 1e-5 * norm;
      for (int j = 0; j < m; ++j) {
        double f = 0.0, scale = 0.0;
        for (int a = 0; a < d; ++a) {
          const double term = linear[size_t(j * d + a)] * k[size_t(a)];
          f += term;
          scale += std::fabs(term);
          for (int b = 0; b < d; ++b) {
            const double q = k[size_t(a)] * quadratic[(size_t(j) * d + a) * d + b] * k[size_t(b)];
            f += q;
            scale += std::fabs(q);
          }
        }
        const size_t i = size_t(j) * n + e;
        if (std::fabs(gpu_forms[i] - f) > 1e-5 * scale || std::fabs(cpu_forms[i] - f) > 1e-5 * scale) {
          ADD_FAILURE() << "head " << head << " form " << j << " entry " << e << ": cuda " << gpu_forms[i]
                        << ", cpu " << cpu_forms[i] << ", double " << f << " (terms " << scale << ")";
          ++far;
        }
      }
    }
    EXPECT_EQ(far, 0) << "head " << head;
  }
}

TEST_F(CudaKvKeyForms, FormsAndNormsOverSealedAndBf16BlocksMatchTheDoubleAndTheCpu) {
  for (KvQuant quant : {KvQuant::int8, KvQuant::int4}) {
    SCOPED_TRACE(kv_quant_name(quant));
    TwinPool pool(test::quantized_layout(quant), 8);
    for (int32_t slot = 0; slot < 4; ++slot) pool.fill(slot, rng);
    const int32_t q0 = pool.packed_id(5, 0), q1 = pool.packed_id(5, 1);
    pool.seal_on_cpu(*cpu, 0, q0);
    pool.seal_on_cpu(*cpu, 1, q1);
    const std::vector<int32_t> table = {q0, q1, 2, 3};  // entries 0-63 sealed, 64-127 bf16
    expect_forms_of_both(*cpu, *gpu, pool, table, 110, 3, rng);
  }
}

TEST_F(CudaKvKeyForms, ALongBf16LayerAtHeadDim128) {
  const KvBlockLayout layout{2, 128, 16, DType::f32};
  TwinPool pool(layout, 8);
  for (int32_t slot = 0; slot < pool.n_slots; ++slot) pool.fill(slot, rng);
  const std::vector<int32_t> table = {7, 3, 0, 5, 1, 6, 2};  // 112 entries: 3 thread blocks of 32 and one of 5
  expect_forms_of_both(*cpu, *gpu, pool, table, 101, 2, rng);
  expect_forms_of_both(*cpu, *gpu, pool, table, 1, 1, rng);
}

TEST_F(CudaKvKeyForms, BadCallsAreRefusedNamingTheOp) {
  const KvBlockLayout layout{2, 64, 16, DType::f32};
  TwinPool pool(layout, 2);
  const std::vector<int32_t> table = {0, 1};
  const std::vector<float> linear(64), quadratic(64 * 64);
  std::vector<float> forms(20), norms(20), short_forms(19), too_many(33), their_forms(33);
  auto message = [&](auto call) {
    try {
      call();
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message([&] { gpu->kv_key_forms(table, 2, linear, quadratic, pool.gpu, forms, norms); }),
            "kv_key_forms: KV head 2 out of range");
  EXPECT_NE(message([&] { gpu->kv_key_forms(table, 0, linear, quadratic, pool.gpu, short_forms, norms); })
                .find("kv_key_forms: quadratic"),
            std::string::npos);
  EXPECT_EQ(message([&] { gpu->kv_key_forms(table, 0, linear, quadratic, pool.gpu, their_forms, too_many); }),
            "kv_key_forms: more entries than the block table holds");
  const std::vector<int32_t> outside = {0, -1};
  EXPECT_NE(message([&] { gpu->kv_key_forms(outside, 0, linear, quadratic, pool.gpu, forms, norms); })
                .find("block -1 is not a full-precision block"),
            std::string::npos);
}

}  // namespace
}  // namespace strata

#endif  // STRATA_HAVE_CUDA
