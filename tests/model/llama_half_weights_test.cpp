// SmolLM2 with 16-bit float weights (F16 or BF16 GGUFs and safetensors checkpoints, kept as they are under
// model.weight_dtype auto: kernels/cpu/packed_weight.h). Under model.weight_dtype f16 or bf16 the loader rounds the
// file's values to nearest even, and they are held two ways:
//   - held: in the 16-bit format, multiplied by the CPU backend's fused kernels (steps of 8 tokens) and fp32 tiles
//     (steps of 100);
//   - widened: the same rounded values as fp32 matrices, the reference path (BLAS).
// Both multiply the same values in fp32, so they differ by the order of sums only: checked as the top-1 token equal
// at 99.5% of the four reference prompts' positions or more (a different order moves exact near ties only) and
// every logit within 0.002 of the widened model's (SmolLM2's logits reach about 30; 0.00013 at most measured).
// The held model against the transformers reference (fp32 weights from the same GGUF): top-1 equal at 99% of the
// positions or more with f16 (11 significant bits, as the quantized weights' bound; all 1,312 measured), 97% with
// bf16 (8 bits; 1,302 of 1,312 measured).
// With engine.activation_dtype int16 the held model gives the same logits bit for bit: 16-bit float weights
// multiply x itself, never its rounding.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cpu/quantized_matmul.h"
#include "model/llama_model.h"
#include "tests/model/reference_logits.h"
#include "tests/model/smollm2_model.h"

namespace strata {
namespace {

const char* const kPrompts[] = {"short_text", "chat_capital", "code_digits", "long_text"};

// The 16-bit matrices of `half` widened to fp32 (exactly), in storage of their own; the norms point into `half`'s.
ModelWeights widened_weights(const ModelWeights& half) {
  ModelWeights w;
  w.config = half.config;
  w.shard = half.shard;
  w.output_vocab_begin = half.output_vocab_begin;
  w.output_norm = half.output_norm;
  auto widen = [&w](const WeightMatrix& m) {
    auto& storage = w.owned.emplace_back(std::make_unique<uint8_t[]>(size_t(m.size()) * sizeof(float)));
    auto* values = reinterpret_cast<float*>(storage.get());
    for (int64_t r = 0; r < m.rows; ++r) dequantize_weight_row(m.format, m.row(r), values + r * m.cols, m.cols);
    return WeightMatrix{values, WeightFormat::f32, m.rows, m.cols};
  };
  w.token_embd = widen(half.token_embd);
  w.output = half.output.data == half.token_embd.data ? w.token_embd : widen(half.output);
  for (LayerWeights L : half.layers) {
    for (WeightMatrix* m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) *m = widen(*m);
    w.layers.push_back(L);
  }
  return w;
}

// SmolLM2 under model.weight_dtype f16 or bf16: the file's values rounded by the loader and held so; or those
// matrices widened to fp32 (`widened`).
test::SmolLm2 make_model(WeightDtype dtype, bool widened, ActivationDtype activations = ActivationDtype::f32) {
  test::SmolLm2 m = test::load_smollm2(dtype, activations);
  if (widened) {
    auto f32 = std::make_unique<ModelWeights>(widened_weights(*m.weights));
    m.pool.reset();
    m.model = std::make_unique<LlamaModel>(*m.backend, *f32);
    m.pool = std::make_unique<BlockPool>(*m.backend, m.model->kv_layout(16), 6400);
    f32->keep_alive = std::shared_ptr<const ModelWeights>(std::move(m.weights));  // the norms point into it
    m.weights = std::move(f32);
  }
  return m;
}

void expect_held_matches_widened_and_reference(WeightDtype dtype, const std::string& format, double reference_share) {
  test::SmolLm2 held = make_model(dtype, false), widened = make_model(dtype, true);
  EXPECT_EQ(weight_format_info(held.weights->layers[0].w_up.format).name, format);
  EXPECT_EQ(held.backend->uploaded_weight_bytes(held.weights->layers[0].w_up),
            held.weights->layers[0].w_up.size() * 2);  // the file's bytes, not fp32's
  const int64_t vocab = held.model->config().vocab_size;
  static_assert(8 < cpu::kDequantizedTileMinRows && 100 >= cpu::kDequantizedTileMinRows);
  for (int step : {8, 100}) {
    test::TopOneAgreement a;
    for (const char* name : kPrompts) {
      const test::ReferenceLogits ref = test::load_reference_logits(name);
      a.add(test::prompt_logits(held, ref.prompt_ids, step), test::prompt_logits(widened, ref.prompt_ids, step), ref,
            vocab);
    }
    std::cout << "[ half ] " << format << ", steps of " << step << ": top-1 equal to the widened model's at "
              << a.same << " of " << a.positions << " positions, to the reference's at " << a.same_as_reference
              << "; largest logit difference " << a.largest_difference << std::endl;
    EXPECT_GE(a.same, 0.995 * a.positions) << format << ", steps of " << step;
    EXPECT_LT(a.largest_difference, 0.002) << format << ", steps of " << step;
    EXPECT_GE(a.same_as_reference, reference_share * a.positions) << format << ", steps of " << step;
  }
}

TEST(HalfWeights, F16HeldMatchesItsWidenedValuesAndTheReference) {
  expect_held_matches_widened_and_reference(WeightDtype::f16, "f16", 0.99);
}
TEST(HalfWeights, Bf16HeldMatchesItsWidenedValuesAndTheReference) {
  expect_held_matches_widened_and_reference(WeightDtype::bf16, "bf16", 0.97);
}

TEST(HalfWeights, IntegerActivationsLeaveThemAlone) {
  test::SmolLm2 plain = make_model(WeightDtype::bf16, false);
  test::SmolLm2 int16 = make_model(WeightDtype::bf16, false, ActivationDtype::int16);
  const test::ReferenceLogits ref = test::load_reference_logits("chat_capital");
  for (int step : {8, 100}) {
    EXPECT_EQ(test::prompt_logits(int16, ref.prompt_ids, step), test::prompt_logits(plain, ref.prompt_ids, step))
        << "steps of " << step;
  }
}

}  // namespace
}  // namespace strata
