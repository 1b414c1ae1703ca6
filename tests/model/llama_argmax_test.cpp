// LogitsMode::argmax (model/llama_model.h): a greedy sequence's most likely token, reduced by the backend instead of
// read from a logits row on the host, must be the token the logits row gives, in batch order, beside sequences
// that ask for logits, and also when micro-batches cut the step.
#include <algorithm>
#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "cache/kv_cache.h"
#include "tests/model/smollm2_model.h"

namespace strata {
namespace {

TEST(LlamaArgmax, IdsAreTheArgmaxOfTheLogitsRowsInBatchOrder) {
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
  const auto reference_argmax = [&](int row) {
    const float* r = reference.data() + row * vocab;
    return int32_t(std::max_element(r, r + vocab) - r);
  };

  for (int n_micro : {1, 3}) {
    LlamaModel model(*m.backend, *m.weights);
    model.set_micro_batches(n_micro);
    KvCache cache(*m.pool, 0, n_layers);
    const std::vector<BatchSequence> batch = {{1, a, 0, LogitsMode::argmax}, {2, b, 0, LogitsMode::last},
                                              {3, c, 0, LogitsMode::argmax}};
    std::vector<float> logits;
    std::vector<int32_t> ids;
    model.forward(batch, cache, logits, ids);
    EXPECT_EQ(ids, (std::vector<int32_t>{reference_argmax(0), reference_argmax(2)})) << n_micro << " micro-batches";
    ASSERT_EQ(logits.size(), size_t(vocab)) << "only the LogitsMode::last row comes back as logits";
    for (int64_t i = 0; i < vocab; ++i) {
      ASSERT_NEAR(logits[size_t(i)], reference[size_t(vocab + i)], 1e-4f) << "logit " << i;
    }
    // The overload without an argmax output refuses a batch that asks for one.
    std::vector<float> unused;
    const std::vector<BatchSequence> next = {{4, c, 0, LogitsMode::argmax}};
    EXPECT_THROW(model.forward(next, cache, unused), std::invalid_argument);
    for (SeqId s : {1, 2, 3}) cache.release(s);
  }
}

}  // namespace
}  // namespace strata
