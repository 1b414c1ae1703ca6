// Pipeline micro-batches (model/llama_model.h, docs/distributed.md): how a step is cut, and that the pieces compute
// what the whole step computes on the real SmolLM2 (up to the GEMM's row blocking: OpenBLAS sums a row in an order
// that depends on where it falls among the call's rows).
#include <algorithm>
#include <cmath>
#include <iostream>
#include <numeric>
#include <vector>

#include <gtest/gtest.h>

#include "cache/kv_cache.h"
#include "tests/model/smollm2_model.h"

namespace strata {
namespace {

std::vector<int> token_counts(const std::vector<BatchSequence>& micro_batch) {
  std::vector<int> n;
  for (const BatchSequence& s : micro_batch) n.push_back(int(s.tokens.size()));
  return n;
}

TEST(SplitMicroBatches, DecodeRowsAreSharedOutInOrder) {
  const std::vector<int32_t> ids = {5, 6, 7, 8, 9};
  std::vector<BatchSequence> batch;
  for (int i = 0; i < 5; ++i) batch.push_back({SeqId(i), std::span(ids).subspan(size_t(i), 1), 10 + i});
  const auto micro = split_micro_batches(batch, 2);
  ASSERT_EQ(micro.size(), 2u);
  EXPECT_EQ(token_counts(micro[0]), (std::vector<int>{1, 1}));
  EXPECT_EQ(token_counts(micro[1]), (std::vector<int>{1, 1, 1}));
  EXPECT_EQ(micro[1][0].seq, 2);
  EXPECT_EQ(micro[1][2].start_pos, 14);
  // Fewer tokens than micro-batches: one token each.
  EXPECT_EQ(split_micro_batches(std::span(batch).first(2), 4).size(), 2u);
  EXPECT_EQ(split_micro_batches(batch, 1).size(), 1u);
}

TEST(SplitMicroBatches, APromptChunkIsCutBetweenTokensAndOnlyItsLastPieceAsksForLogits) {
  const std::vector<int32_t> prompt(10, 42), one = {7};
  const std::vector<BatchSequence> batch = {{1, one, 20, LogitsMode::last}, {2, prompt, 30, LogitsMode::last},
                                            {3, one, 5, LogitsMode::none}};
  const auto micro = split_micro_batches(batch, 3);  // 12 tokens: 4 each
  ASSERT_EQ(micro.size(), 3u);
  EXPECT_EQ(token_counts(micro[0]), (std::vector<int>{1, 3}));
  EXPECT_EQ(token_counts(micro[1]), (std::vector<int>{4}));
  EXPECT_EQ(token_counts(micro[2]), (std::vector<int>{3, 1}));
  EXPECT_EQ(micro[0][1].start_pos, 30);
  EXPECT_EQ(micro[1][0].start_pos, 33);
  EXPECT_EQ(micro[2][0].start_pos, 37);
  EXPECT_EQ(micro[0][0].logits, LogitsMode::last);
  EXPECT_EQ(micro[0][1].logits, LogitsMode::none);
  EXPECT_EQ(micro[1][0].logits, LogitsMode::none);
  EXPECT_EQ(micro[2][0].logits, LogitsMode::last);
  EXPECT_EQ(micro[2][1].logits, LogitsMode::none);
}

// Two prompts prefilled together, then three decode steps of both, whole and in 3 micro-batches (so one prompt
// is cut): the same greedy tokens, logits within 1e-4, the same cache lengths.
TEST(LlamaMicroBatches, PiecesComputeWhatTheWholeStepComputes) {
  test::SmolLm2& m = test::smollm2();
  const int n_layers = m.model->config().n_layers;
  const int64_t vocab = m.model->config().vocab_size;
  const std::vector<int32_t> a = {504, 3458, 1977, 5223, 2347, 314, 260, 1345, 28, 4112, 314},
                             b = {1590, 744, 253, 655, 30, 5301, 11139};
  std::vector<std::vector<float>> runs;
  std::vector<std::vector<int>> lengths;
  for (int n_micro : {1, 3}) {
    LlamaModel model(*m.backend, *m.weights);
    model.set_micro_batches(n_micro);
    KvCache cache(*m.pool, 0, n_layers);
    std::vector<float> all, logits;
    std::vector<int32_t> next(2);
    std::vector<BatchSequence> batch = {{1, a, 0, LogitsMode::last}, {2, b, 0, LogitsMode::last}};
    int pos_a = int(a.size()), pos_b = int(b.size());
    for (int step = 0; step < 4; ++step) {
      model.forward(batch, cache, logits);
      ASSERT_EQ(logits.size(), size_t(2 * vocab));
      all.insert(all.end(), logits.begin(), logits.end());
      for (int s = 0; s < 2; ++s) {
        const float* row = logits.data() + s * vocab;
        next[size_t(s)] = int32_t(std::max_element(row, row + vocab) - row);
      }
      batch = {{1, std::span(next).subspan(0, 1), pos_a++}, {2, std::span(next).subspan(1, 1), pos_b++}};
    }
    runs.push_back(all);
    lengths.push_back({cache.layer(1, 0).n_entries, cache.layer(2, n_layers - 1).n_entries});
    cache.release(1);
    cache.release(2);
  }
  ASSERT_EQ(runs[0].size(), runs[1].size());
  float max_diff = 0.0f;
  for (size_t i = 0; i < runs[0].size(); ++i) max_diff = std::max(max_diff, std::abs(runs[0][i] - runs[1][i]));
  EXPECT_LE(max_diff, 1e-4f);
  for (size_t r = 0; r < runs[0].size() / size_t(vocab); ++r) {
    const auto row = [&](int run) { return runs[size_t(run)].begin() + ptrdiff_t(r * size_t(vocab)); };
    EXPECT_EQ(std::max_element(row(0), row(0) + vocab) - row(0), std::max_element(row(1), row(1) + vocab) - row(1))
        << r;
  }
  EXPECT_EQ(lengths[0], lengths[1]);
  EXPECT_EQ(lengths[0], (std::vector<int>{int(a.size()) + 3, int(b.size()) + 3}));
  std::cout << "micro-batched logits: largest difference from the whole step " << max_diff << "\n";
}

}  // namespace
}  // namespace strata
