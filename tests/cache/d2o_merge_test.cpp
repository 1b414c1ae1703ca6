// D2O's token-level compensation (cache/policies/d2o_merge.h): the EMA threshold over several steps and the
// merge of given vectors under both weight rules, applied by the CPU backend's kv_merge; hand-computed values.
#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "cache/policies/d2o_merge.h"
#include "kernels/backend.h"

namespace strata {
namespace {

TEST(D2oThreshold, StartsAtTheFirstMeanThenFollowsTheEma) {
  D2oThreshold tau(0.5, 0.5);  // the code's alpha = belta = 0.5
  EXPECT_FALSE(tau.value().has_value());
  EXPECT_DOUBLE_EQ(tau.update(0.8), 0.8);   // tau_0: the mean itself
  EXPECT_DOUBLE_EQ(tau.update(0.6), 0.7);   // 0.5 * 0.8 + 0.5 * 0.6
  EXPECT_DOUBLE_EQ(tau.update(0.9), 0.8);   // 0.5 * 0.7 + 0.5 * 0.9
  EXPECT_DOUBLE_EQ(tau.update(0.2), 0.5);
  EXPECT_DOUBLE_EQ(*tau.value(), 0.5);

  D2oThreshold paper(0.3, 0.7);  // the paper's beta = 0.7 on the current step
  EXPECT_DOUBLE_EQ(paper.update(0.5), 0.5);
  EXPECT_DOUBLE_EQ(paper.update(1.0), 0.85);   // 0.3 * 0.5 + 0.7
  EXPECT_DOUBLE_EQ(paper.update(0.0), 0.255);  // 0.3 * 0.85
}

// Two targets: entry 0 takes entries 1 (u = 0.5) and 2 (u = 1.0); entry 3 takes entry 4 (u = 0.8).
const std::vector<D2oMergeCandidate> kChosen = {{4, 3, 0.8f}, {1, 0, 0.5f}, {2, 0, 1.0f}};

TEST(D2oMerges, CodeMeanWeights) {
  const KvMerges m = d2o_merges(kChosen, D2oMergeWeight::code_mean);
  EXPECT_EQ(m.targets, (std::vector<int32_t>{0, 3}));  // ascending
  EXPECT_EQ(m.source_begin, (std::vector<int32_t>{0, 2, 3}));
  EXPECT_EQ(m.sources, (std::vector<int32_t>{1, 2, 4}));
  // (k + 0.5 k1 + 1.0 k2) / 3 and (k + 0.8 k4) / 2: the weights do not sum to 1.
  EXPECT_FLOAT_EQ(m.target_weights[0], 1.0f / 3);
  EXPECT_FLOAT_EQ(m.source_weights[0], 0.5f / 3);
  EXPECT_FLOAT_EQ(m.source_weights[1], 1.0f / 3);
  EXPECT_FLOAT_EQ(m.target_weights[1], 0.5f);
  EXPECT_FLOAT_EQ(m.source_weights[2], 0.4f);
}

TEST(D2oMerges, PaperSoftmaxWeightsSumToOne) {
  const KvMerges m = d2o_merges(kChosen, D2oMergeWeight::paper_softmax);
  // Target 0: e / (2e + e^0.5), e^0.5 / (2e + e^0.5), e / (2e + e^0.5).
  EXPECT_FLOAT_EQ(m.target_weights[0], 0.3836517311905507f);
  EXPECT_FLOAT_EQ(m.source_weights[0], 0.23269653761889864f);
  EXPECT_FLOAT_EQ(m.source_weights[1], 0.3836517311905507f);
  // Target 3: e / (e + e^0.8), e^0.8 / (e + e^0.8).
  EXPECT_FLOAT_EQ(m.target_weights[1], 0.5498339973124778f);
  EXPECT_FLOAT_EQ(m.source_weights[2], 0.45016600268752216f);
}

// Entries 0..4 of one KV head (head dim 2, one block of 8): keys and values given, merged by the backend.
std::vector<std::vector<float>> merged_keys(D2oMergeWeight rule) {
  const KvBlockLayout layout{1, 2, 8, DType::f32};
  std::vector<float> memory(size_t(layout.elements_per_block()), 0.0f);
  const KvPoolView view{memory.data(), layout, 0, {}};
  const std::vector<std::vector<float>> keys = {{1, 0}, {0, 1}, {1, 1}, {2, 2}, {0, 4}};
  for (int e = 0; e < 5; ++e) {
    std::copy(keys[size_t(e)].begin(), keys[size_t(e)].end(), memory.data() + layout.k_offset(0, e));
    // Values: the keys times 10, so the same weights must show in both.
    for (int d = 0; d < 2; ++d) memory[size_t(layout.v_offset(0, e) + d)] = 10 * keys[size_t(e)][size_t(d)];
  }
  const std::vector<int32_t> table = {0};
  make_cpu_backend()->kv_merge(table, d2o_merges(kChosen, rule), view, 0);
  std::vector<std::vector<float>> out;
  for (int e = 0; e < 5; ++e) {
    const float* k = memory.data() + layout.k_offset(0, e);
    const float* v = memory.data() + layout.v_offset(0, e);
    EXPECT_FLOAT_EQ(v[0], 10 * k[0]);
    EXPECT_FLOAT_EQ(v[1], 10 * k[1]);
    out.push_back({k[0], k[1]});
  }
  return out;
}

TEST(D2oMerges, GivenVectorsUnderBothRules) {
  // code_mean: k0 = ((1,0) + 0.5 (0,1) + (1,1)) / 3 = (2/3, 1/2); k3 = ((2,2) + 0.8 (0,4)) / 2 = (1, 2.6).
  std::vector<std::vector<float>> k = merged_keys(D2oMergeWeight::code_mean);
  EXPECT_FLOAT_EQ(k[0][0], 2.0f / 3);
  EXPECT_FLOAT_EQ(k[0][1], 0.5f);
  EXPECT_FLOAT_EQ(k[3][0], 1.0f);
  EXPECT_FLOAT_EQ(k[3][1], 2.6f);
  EXPECT_EQ(k[1], (std::vector<float>{0, 1}));  // evicted entries are read, not changed
  // paper_softmax: k0 = (w_c + w_2, w_1 + w_2) = (0.76730, 0.61635); k3 = (2 w_c, 2 w_c + 4 w_4).
  k = merged_keys(D2oMergeWeight::paper_softmax);
  EXPECT_FLOAT_EQ(k[0][0], 0.7673034623811014f);
  EXPECT_FLOAT_EQ(k[0][1], 0.6163482688094493f);
  EXPECT_FLOAT_EQ(k[3][0], 2 * 0.5498339973124778f);
  EXPECT_FLOAT_EQ(k[3][1], 2 * 0.5498339973124778f + 4 * 0.45016600268752216f);
}

}  // namespace
}  // namespace strata
