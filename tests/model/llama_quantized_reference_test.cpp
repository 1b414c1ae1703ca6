// SmolLM2 with its weights kept quantized against the transformers reference (tests/model/reference_logits.h,
// fp32 weights dequantized from the same GGUF):
//   - model.weight_dtype auto: the file's Q4_1 and Q8_0 blocks, as the server runs by default;
//   - model.weight_dtype q8_0: everything requantized to Q8_0;
//   - auto with engine.activation_dtype int8 or int16: the matmuls' inputs rounded to int8 or int16 per block of 32.
// Logits are computed in steps of 8 tokens (the fused kernels, kernels/cpu/quantized_dot.h) and in prefill chunks
// of 100 (dequantized fp32 tiles). Both multiply the weights' exact values in fp32, so under auto the model is the
// fp32 reference's up to the order of sums. Checked over the positions of the four reference prompts:
//   - auto: the top-1 token equals the reference's at 99% of them or more (the [cpu-speed] goal);
//   - q8_0: at 97% or more: the file's Q4_1 values rounded again to Q8_0 move near ties (q8_0 is meant for 16-bit
//     checkpoints, where it rounds once);
//   - int8 activations: at 95% or more (96.4-97.3% measured: the rounding moves near ties; docs/decisions.md
//     [cpu-xeon]);
//   - int16 activations: at 99% or more, as auto with fp32 ones (their rounding is 1/256 of int8's);
//   - the perplexity of long_text's 1,114 next tokens within 1% of the fp32 weights' (WeightDtype::f32) with fp32
//     and int16 activations, within 3% with int8 ones (+0.46-0.9% measured);
//   - greedy generation of 64 tokens under auto, with fp32 and with int16 activations, equals the reference's,
//     except after a near tie of the reference's (as tests/model/llama_reference_test.cpp asks of the fp32 path).
#include <cmath>
#include <iostream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cache/kv_cache.h"
#include "kernels/cpu/quantized_dot.h"
#include "kernels/cpu/quantized_matmul.h"
#include "model/llama_model.h"
#include "tests/model/reference_logits.h"
#include "tests/model/smollm2_model.h"

namespace strata {
namespace {

const char* const kPrompts[] = {"short_text", "chat_capital", "code_digits", "long_text"};

// Mean negative log-likelihood of ids[t + 1] under the logits at position t.
double mean_nll(const std::vector<float>& logits, const std::vector<int32_t>& ids, int64_t vocab) {
  double sum = 0;
  for (size_t t = 0; t + 1 < ids.size(); ++t) {
    const float* row = logits.data() + int64_t(t) * vocab;
    const float top = row[test::argmax(row, vocab)];
    double z = 0;
    for (int64_t v = 0; v < vocab; ++v) z += std::exp(double(row[v]) - top);
    sum += -(double(row[ids[t + 1]]) - top - std::log(z));
  }
  return sum / double(ids.size() - 1);
}

void expect_top1_agreement(test::SmolLm2& m, const char* dtype_name, double share) {
  const int64_t vocab = m.model->config().vocab_size;
  static_assert(8 < cpu::kDequantizedTileMinRows && 100 >= cpu::kDequantizedTileMinRows);
  for (int step : {8, 100}) {
    int positions = 0, equal = 0;
    for (const char* name : kPrompts) {
      const test::ReferenceLogits ref = test::load_reference_logits(name);
      const std::vector<float> logits = test::prompt_logits(m, ref.prompt_ids, step);
      int prompt_equal = 0;
      for (size_t t = 0; t < ref.prompt_ids.size(); ++t) {
        prompt_equal += test::argmax(logits.data() + int64_t(t) * vocab, vocab) == ref.top_ids[t * test::kReferenceTopK];
      }
      std::cout << "[ quantized ] " << dtype_name << ", steps of " << step << ", " << name << ": top-1 equal at "
                << prompt_equal << " of " << ref.prompt_ids.size() << " positions" << std::endl;
      positions += int(ref.prompt_ids.size());
      equal += prompt_equal;
    }
    EXPECT_GE(equal, share * positions) << dtype_name << ", steps of " << step << ": " << equal << " of " << positions;
  }
}

TEST(QuantizedWeights, Top1AgreesWithTransformersUnderAuto) {
  expect_top1_agreement(test::smollm2(WeightDtype::automatic), "auto", 0.99);
}
TEST(QuantizedWeights, Top1AgreesWithTransformersUnderQ8_0) {
  expect_top1_agreement(test::smollm2(WeightDtype::q8_0), "q8_0", 0.97);
}
TEST(QuantizedWeights, Top1AgreesWithTransformersUnderInt8Activations) {
  expect_top1_agreement(test::smollm2_integer_activations(ActivationDtype::int8), "auto + int8 activations", 0.95);
}
TEST(QuantizedWeights, Top1AgreesWithTransformersUnderInt16Activations) {
  expect_top1_agreement(test::smollm2_integer_activations(ActivationDtype::int16), "auto + int16 activations", 0.99);
}

// The AVX2 level's kernels on a machine with a better one (engine.cpu_kernels: avx2): Q4_1 in its tiles, Q8_0 in
// pairs multiplied in fp32 on the rounded values, as an AVX2-only machine runs them.
TEST(QuantizedWeights, Top1AgreesWithTransformersUnderInt16ActivationsAtTheAvx2Level) {
  const cpu::CpuIsa best = cpu::best_cpu_isa();
  if (best == cpu::CpuIsa::baseline || best == cpu::CpuIsa::avx2) GTEST_SKIP() << "the test above runs this level";
  cpu::limit_cpu_isa(cpu::CpuIsa::avx2);
  {
    test::SmolLm2 m = test::load_smollm2(WeightDtype::automatic, ActivationDtype::int16);
    expect_top1_agreement(m, "auto + int16 activations at avx2", 0.99);
  }
  cpu::limit_cpu_isa(best);
}

TEST(QuantizedWeights, PerplexityWithinOnePercentOfFp32) {
  const test::ReferenceLogits ref = test::load_reference_logits("long_text");
  const int64_t vocab = test::smollm2().model->config().vocab_size;
  const double exact = std::exp(mean_nll(test::prompt_logits(test::smollm2(WeightDtype::f32), ref.prompt_ids, 8),
                                         ref.prompt_ids, vocab));
  for (WeightDtype dtype : {WeightDtype::automatic, WeightDtype::q8_0}) {
    const double ppl =
        std::exp(mean_nll(test::prompt_logits(test::smollm2(dtype), ref.prompt_ids, 8), ref.prompt_ids, vocab));
    std::cout << "[ quantized ] long_text perplexity: f32 " << exact << ", "
              << (dtype == WeightDtype::q8_0 ? "q8_0 " : "auto ") << ppl << std::endl;
    EXPECT_NEAR(ppl / exact, 1.0, 0.01);
  }
  for (ActivationDtype dtype : {ActivationDtype::int8, ActivationDtype::int16}) {
    const bool int16 = dtype == ActivationDtype::int16;
    test::SmolLm2& m = test::smollm2_integer_activations(dtype);
    const std::vector<float> logits = test::prompt_logits(m, ref.prompt_ids, 8);
    const double ppl = std::exp(mean_nll(logits, ref.prompt_ids, vocab));
    std::cout << "[ quantized ] long_text perplexity: auto + " << (int16 ? "int16" : "int8") << " activations " << ppl
              << std::endl;
    EXPECT_NEAR(ppl / exact, 1.0, int16 ? 0.01 : 0.03);
  }
}

// Greedy generation from each reference prompt equals the reference's, except after a near tie of its own.
void expect_greedy_generation(test::SmolLm2& m, const char* dtype_name) {
  const int64_t vocab = m.model->config().vocab_size;
  for (const char* name : kPrompts) {
    const test::ReferenceLogits ref = test::load_reference_logits(name);
    KvCache cache(*m.pool, 0, m.model->config().n_layers);
    const int n = int(ref.prompt_ids.size());
    std::vector<float> logits;
    const BatchSequence prompt{3, ref.prompt_ids, 0, LogitsMode::last};
    m.model->forward({&prompt, 1}, cache, logits);
    size_t same = 0;
    for (; same < ref.greedy_ids.size(); ++same) {
      const int32_t next = test::argmax(logits.data(), vocab);
      if (next != ref.greedy_ids[same]) {
        EXPECT_LT(ref.greedy_margins[same], 1e-3f) << dtype_name << ", " << name << ": greedy token " << same
                                                   << " is " << next << ", reference " << ref.greedy_ids[same];
        break;
      }
      const BatchSequence seq{3, std::span<const int32_t>(&ref.greedy_ids[same], 1), n + int(same), LogitsMode::last};
      m.model->forward({&seq, 1}, cache, logits);
    }
    std::cout << "[ quantized ] " << dtype_name << ", " << name << ": the first " << same << " of "
              << ref.greedy_ids.size() << " greedy tokens equal the reference's" << std::endl;
  }
}

TEST(QuantizedWeights, GreedyGenerationAgainstTransformers) {
  expect_greedy_generation(test::smollm2(WeightDtype::automatic), "auto");
}
TEST(QuantizedWeights, GreedyGenerationAgainstTransformersUnderInt16Activations) {
  expect_greedy_generation(test::smollm2_integer_activations(ActivationDtype::int16), "auto + int16 activations");
}

}  // namespace
}  // namespace strata
