// LogitsMode::sample (model/llama_model.h): a token chosen by the backend where the logits are, instead of from a
// logits row on the host, must be the token the rule (kernels/token_sampling.h) gives on that row, in batch order,
// beside sequences that ask for logits, and also when micro-batches cut the step.
#include <algorithm>
#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "cache/kv_cache.h"
#include "tests/model/smollm2_model.h"

namespace strata {
namespace {

TEST(LlamaSampledRows, TokensAreTheRuleOnTheLogitsRowsInBatchOrder) {
  test::SmolLm2& m = test::smollm2();
  const int n_layers = m.model->config().n_layers;
  const int64_t vocab = m.model->config().vocab_size;
  const std::vector<int32_t> a = {504, 3458, 1977, 5223, 2347, 314, 260}, b = {1590, 744, 253, 655, 30},
                             c = {28, 4112, 314, 1345};

  // Every sequence's last row as logits: the reference.
  std::vector<float> reference;
  {
    LlamaModel model(*m.backend, *m.weights);
    KvCache cache(*m.pool, 0, n_layers);
    const std::vector<BatchSequence> batch = {{1, a, 0, LogitsMode::last}, {2, b, 0, LogitsMode::last},
                                              {3, c, 0, LogitsMode::last}};
    model.forward(batch, cache, reference);
    for (SeqId s : {1, 2, 3}) cache.release(s);
  }
  ASSERT_EQ(reference.size(), size_t(3 * vocab));

  // Sequence 1 is greedy; sequence 3 draws at temperature 0.8 from the nucleus, with a penalty and logprobs.
  RowSampling greedy;
  const std::vector<TokenPenalty> penalties = {{314, 1.5f}, {1345, 0.5f}};
  RowSampling drawn;
  drawn.temperature = 0.8f;
  drawn.top_p = 0.9f;
  drawn.n_logprobs = 3;
  drawn.uniform = 0.6180339887;
  drawn.penalties = penalties;
  const auto on_reference = [&](int row, const RowSampling& s) {
    std::vector<float> r(reference.begin() + row * vocab, reference.begin() + (row + 1) * vocab);
    return sample_row_on_host(r, s);
  };
  const RowSample want_a = on_reference(0, greedy), want_c = on_reference(2, drawn);
  EXPECT_EQ(want_a.id, int32_t(std::max_element(reference.begin(), reference.begin() + vocab) - reference.begin()));

  for (int n_micro : {1, 3}) {
    LlamaModel model(*m.backend, *m.weights);
    model.set_micro_batches(n_micro);
    KvCache cache(*m.pool, 0, n_layers);
    std::vector<BatchSequence> batch = {{1, a, 0, LogitsMode::sample}, {2, b, 0, LogitsMode::last},
                                        {3, c, 0, LogitsMode::sample}};
    batch[0].sampling = &greedy;
    batch[2].sampling = &drawn;
    std::vector<float> logits;
    std::vector<RowSample> samples;
    model.forward(batch, cache, logits, samples);
    ASSERT_EQ(samples.size(), 2u) << n_micro << " micro-batches";
    EXPECT_EQ(samples[0].id, want_a.id) << n_micro << " micro-batches";
    EXPECT_EQ(samples[1].id, want_c.id) << n_micro << " micro-batches";
    EXPECT_NEAR(samples[1].logprob, want_c.logprob, 1e-4f);
    ASSERT_EQ(samples[1].top.size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(samples[1].top[i].id, want_c.top[i].id) << "top " << i;
      EXPECT_NEAR(samples[1].top[i].logprob, want_c.top[i].logprob, 1e-4f) << "top " << i;
    }
    ASSERT_EQ(logits.size(), size_t(vocab)) << "only the LogitsMode::last row comes back as logits";
    for (int64_t i = 0; i < vocab; ++i) {
      ASSERT_NEAR(logits[size_t(i)], reference[size_t(vocab + i)], 1e-4f) << "logit " << i;
    }
    // The overload without a samples output refuses a batch that asks for one, and a sampled row needs its
    // sampling.
    std::vector<float> unused;
    std::vector<BatchSequence> next = {{4, c, 0, LogitsMode::sample}};
    next[0].sampling = &greedy;
    EXPECT_THROW(model.forward(next, cache, unused), std::invalid_argument);
    next[0].sampling = nullptr;
    EXPECT_THROW(model.forward(next, cache, unused, samples), std::invalid_argument);
    for (SeqId s : {1, 2, 3}) cache.release(s);
  }
}

}  // namespace
}  // namespace strata
