// SmolLM2 with its KV cache in 16-bit floats (kv_cache.dtype f16 | bf16: half an fp32 pool's memory), against the
// same model (fp32 weights) with an fp32 pool and against the transformers reference, on the four reference prompts
// fed 8 tokens at a time (every chunk reads the rounded entries of the ones before). The 16-bit pool changes what
// attention reads by one rounding of each key and value (11 significant bits in f16, 8 in bf16). Measured: f16
// top-1 equal to the fp32 pool's and to the reference's at all 1,312 positions, logits within 0.052; bf16 at
// 1,310, logits within 0.32 (they reach about 30). Bounds: 99.5% and 0.15 for f16, 99% and 1.0 for bf16.
#include <algorithm>
#include <cmath>
#include <iostream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/model/reference_logits.h"
#include "tests/model/smollm2_model.h"

namespace strata {
namespace {

void expect_half_pool_close(DType dtype, double share, double logit_bound) {
  test::SmolLm2& m = test::smollm2(WeightDtype::f32);
  KvBlockLayout layout = m.model->kv_layout(16);
  layout.dtype = dtype;
  BlockPool half_pool(*m.backend, layout, 6400);
  const int64_t vocab = m.model->config().vocab_size;
  const int step = 8;
  test::TopOneAgreement a;
  for (const char* name : {"short_text", "chat_capital", "code_digits", "long_text"}) {
    const test::ReferenceLogits ref = test::load_reference_logits(name);
    a.add(test::prompt_logits(*m.model, half_pool, ref.prompt_ids, step),
                  test::prompt_logits(m, ref.prompt_ids, step), ref, vocab);
  }
  std::cout << "[ half KV ] " << dtype_name(dtype) << ", steps of " << step << ": top-1 equal to the fp32 pool's at "
            << a.same << " of " << a.positions << " positions, to the reference's at " << a.same_as_reference
            << "; largest logit difference " << a.largest_difference << std::endl;
  EXPECT_GE(a.same, share * a.positions) << dtype_name(dtype) << ", steps of " << step;
  EXPECT_GE(a.same_as_reference, share * a.positions) << dtype_name(dtype) << ", steps of " << step;
  EXPECT_LT(a.largest_difference, logit_bound) << dtype_name(dtype) << ", steps of " << step;
}

TEST(HalfKvCache, F16PoolKeepsTheFp32PoolsTokens) { expect_half_pool_close(DType::f16, 0.995, 0.15); }
TEST(HalfKvCache, Bf16PoolKeepsTheFp32PoolsTokens) { expect_half_pool_close(DType::bf16, 0.99, 1.0); }

}  // namespace
}  // namespace strata
