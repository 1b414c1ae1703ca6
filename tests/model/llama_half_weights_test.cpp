// SmolLM2 with 16-bit float weights (F16 or BF16 GGUFs and safetensors checkpoints, kept as they are under
// model.weight_dtype auto: kernels/cpu/packed_weight.h). The file's weights (fp32, dequantized) are rounded to f16 or
// bf16 to nearest even, then held two ways:
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

uint16_t round_to_half(float v, WeightFormat half) {
  if (half == WeightFormat::f16) return fp32_to_fp16(v);
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  return uint16_t((bits + 0x7FFF + (bits >> 16 & 1)) >> 16);  // bf16, to nearest even (SmolLM2 has no NaN)
}

float half_value(uint16_t h, WeightFormat half) {
  return half == WeightFormat::f16 ? fp16_to_fp32(h) : bf16_to_fp32(h);
}

// m (fp32) rounded to `half`, held in that format or widened back to fp32, in storage owned by `w`.
WeightMatrix rounded(const WeightMatrix& m, WeightFormat half, bool held, ModelWeights& w) {
  const WeightMatrix out{nullptr, held ? half : WeightFormat::f32, m.rows, m.cols};
  auto& storage = w.owned.emplace_back(std::make_unique<uint8_t[]>(size_t(out.bytes())));
  for (int64_t i = 0; i < m.size(); ++i) {
    const uint16_t h = round_to_half(m.f32()[i], half);
    if (held) {
      std::memcpy(storage.get() + 2 * i, &h, 2);
    } else {
      const float v = half_value(h, half);
      std::memcpy(storage.get() + 4 * i, &v, 4);
    }
  }
  WeightMatrix result = out;
  result.data = storage.get();
  return result;
}

// SmolLM2's fp32 weights with every matrix rounded (the norms stay fp32, pointing into the f32 model's weights).
ModelWeights rounded_weights(const ModelWeights& f32, WeightFormat half, bool held) {
  ModelWeights w;
  w.config = f32.config;
  w.shard = f32.shard;
  w.output_vocab_begin = f32.output_vocab_begin;
  w.output_norm = f32.output_norm;
  w.token_embd = rounded(f32.token_embd, half, held, w);
  w.output = f32.output.data == f32.token_embd.data ? w.token_embd : rounded(f32.output, half, held, w);
  for (LayerWeights L : f32.layers) {
    for (WeightMatrix* m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) *m = rounded(*m, half, held, w);
    w.layers.push_back(L);
  }
  return w;
}

test::SmolLm2 make_model(WeightFormat half, bool held, ActivationDtype activations = ActivationDtype::f32) {
  test::SmolLm2 m;
  m.weights = std::make_unique<ModelWeights>(rounded_weights(*test::smollm2(WeightDtype::f32).weights, half, held));
  m.backend = make_cpu_backend(activations);
  m.model = std::make_unique<LlamaModel>(*m.backend, *m.weights);
  m.pool = std::make_unique<BlockPool>(*m.backend, m.model->kv_layout(16), 2400);  // long_text in every layer
  return m;
}

void expect_held_matches_widened_and_reference(WeightFormat half, double reference_share) {
  const std::string format(weight_format_info(half).name);
  test::SmolLm2 held = make_model(half, true), widened = make_model(half, false);
  EXPECT_EQ(held.backend->uploaded_weight_bytes(held.weights->layers[0].w_up),
            held.weights->layers[0].w_up.size() * 2);  // the file's bytes, not fp32's
  const int64_t vocab = held.model->config().vocab_size;
  static_assert(8 < cpu::kDequantizedTileMinRows && 100 >= cpu::kDequantizedTileMinRows);
  for (int step : {8, 100}) {
    int positions = 0, same_as_widened = 0, same_as_reference = 0;
    double largest_difference = 0;
    for (const char* name : kPrompts) {
      const test::ReferenceLogits ref = test::load_reference_logits(name);
      const std::vector<float> a = test::prompt_logits(held, ref.prompt_ids, step);
      const std::vector<float> b = test::prompt_logits(widened, ref.prompt_ids, step);
      for (size_t t = 0; t < ref.prompt_ids.size(); ++t) {
        const int64_t top = test::argmax(a.data() + int64_t(t) * vocab, vocab);
        same_as_widened += top == test::argmax(b.data() + int64_t(t) * vocab, vocab);
        same_as_reference += top == ref.top_ids[t * test::kReferenceTopK];
      }
      for (size_t k = 0; k < a.size(); ++k) {
        largest_difference = std::max(largest_difference, double(std::fabs(a[k] - b[k])));
      }
      positions += int(ref.prompt_ids.size());
    }
    std::cout << "[ half ] " << format << ", steps of " << step << ": top-1 equal to the widened model's at "
              << same_as_widened << " of " << positions << " positions, to the reference's at " << same_as_reference
              << "; largest logit difference " << largest_difference << std::endl;
    EXPECT_GE(same_as_widened, 0.995 * positions) << format << ", steps of " << step;
    EXPECT_LT(largest_difference, 0.002) << format << ", steps of " << step;
    EXPECT_GE(same_as_reference, reference_share * positions) << format << ", steps of " << step;
  }
}

TEST(HalfWeights, F16HeldMatchesItsWidenedValuesAndTheReference) {
  expect_held_matches_widened_and_reference(WeightFormat::f16, 0.99);
}
TEST(HalfWeights, Bf16HeldMatchesItsWidenedValuesAndTheReference) {
  expect_held_matches_widened_and_reference(WeightFormat::bf16, 0.97);
}

TEST(HalfWeights, IntegerActivationsLeaveThemAlone) {
  test::SmolLm2 plain = make_model(WeightFormat::bf16, true);
  test::SmolLm2 int16 = make_model(WeightFormat::bf16, true, ActivationDtype::int16);
  const test::ReferenceLogits ref = test::load_reference_logits("chat_capital");
  for (int step : {8, 100}) {
    EXPECT_EQ(test::prompt_logits(int16, ref.prompt_ids, step), test::prompt_logits(plain, ref.prompt_ids, step))
        << "steps of " << step;
  }
}

}  // namespace
}  // namespace strata
