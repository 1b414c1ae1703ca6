// Backend::kv_key_forms on the CPU (kernels/cpu/kv_key_forms.cpp) against the forms computed in double from the
// entries themselves: over a layer whose first group is sealed to int4 (read back through kv_dequantize) and
// whose tail is full precision, on both KV heads, with three forms at once; and the errors of a bad call.
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <stdexcept>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/backend.h"
#include "kernels/kv_block_layout.h"

namespace strata {
namespace {

TEST(KvKeyForms, QuadraticFormsAndValueNormsOverSealedAndFullPrecisionBlocks) {
  auto backend = make_cpu_backend();
  ASSERT_TRUE(backend->has_kv_key_forms());
  KvBlockLayout L;
  L.n_kv_heads = 2;
  L.head_dim = 64;
  L.block_size = kKvQuantGroup;
  L.quant = KvQuant::int4;
  const int n_slots = 4;
  Tensor storage = backend->alloc(n_slots, L.elements_per_block(), DType::f32);
  const KvPoolView pool{storage.data, L, n_slots, {}};
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int slot : {0, 1}) {
    float* block = pool.block_f32(slot);
    for (int64_t i = 0; i < L.elements_per_block(); ++i) block[i] = normal(rng);
  }
  // Slot 0 sealed into quantized block q; slot 2 holds q read back, which is what the op must see.
  const int32_t q = n_slots;
  backend->kv_quantize(std::vector<int32_t>{0}, std::vector<int32_t>{q}, pool);
  backend->kv_dequantize(std::vector<int32_t>{q}, std::vector<int32_t>{2}, pool);
  const std::vector<int32_t> table = {q, 1};  // entries 0-31 sealed, 32-49 in full-precision slot 1
  const int n = 50, d = L.head_dim, m = 3;
  std::vector<float> linear(size_t(m) * d), quadratic(size_t(m) * d * d);
  for (float& x : linear) x = normal(rng);
  for (float& x : quadratic) x = 0.1f * normal(rng);
  for (int head = 0; head < 2; ++head) {
    std::vector<float> forms(size_t(m) * n), norms(static_cast<size_t>(n));
    backend->kv_key_forms(table, head, linear, quadratic, pool, forms, norms);
    for (int e = 0; e < n; ++e) {
      const float* block = pool.block_f32(e < 32 ? 2 : 1);
      const float* k = block + L.k_offset(head, e % 32);
      const float* v = block + L.v_offset(head, e % 32);
      double v2 = 0.0;
      for (int i = 0; i < d; ++i) v2 += double(v[i]) * v[i];
      EXPECT_NEAR(norms[e], std::sqrt(v2), 1e-5 * std::sqrt(v2)) << "head " << head << " entry " << e;
      for (int j = 0; j < m; ++j) {
        double f = 0.0, scale = 0.0;
        for (int a = 0; a < d; ++a) {
          f += double(linear[j * d + a]) * k[a];
          scale += std::fabs(double(linear[j * d + a]) * k[a]);
          for (int b = 0; b < d; ++b) {
            const double term = double(k[a]) * quadratic[(size_t(j) * d + a) * d + b] * k[b];
            f += term;
            scale += std::fabs(term);
          }
        }
        EXPECT_NEAR(forms[size_t(j) * n + e], f, 1e-5 * scale) << "head " << head << " form " << j << " entry " << e;
      }
    }
  }
  std::vector<float> forms(size_t(m) * n), norms(static_cast<size_t>(n));
  EXPECT_THROW(backend->kv_key_forms(table, 2, linear, quadratic, pool, forms, norms), std::invalid_argument);
  std::vector<float> short_forms(forms.size() - 1);
  EXPECT_THROW(backend->kv_key_forms(table, 0, linear, quadratic, pool, short_forms, norms), std::invalid_argument);
  std::vector<float> too_many(65), their_forms(size_t(m) * 65);
  EXPECT_THROW(backend->kv_key_forms(table, 0, linear, quadratic, pool, their_forms, too_many), std::invalid_argument);
  backend->free(storage);
}

}  // namespace
}  // namespace strata
