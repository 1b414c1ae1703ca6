// D2O's layer level (cache/policies/d2o_allocation.h) on hand-computed cases, and its statistic split over two
// tensor-parallel "ranks" (threads with an in-process all-reduce) against the one-rank value.
#include <cmath>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "cache/policies/d2o_allocation.h"
#include "policy_test_states.h"
#include "thread_group.h"

namespace strata {
namespace {

TEST(D2oAllocation, ColumnSumVariancesAreUnbiasedPerHead) {
  // 2 heads, 4 entries; every row sums to 1, so each head's column sums add up to 4 (mean 1).
  const std::vector<float> sums = {2, 1, 1, 0,   // (1 + 0 + 0 + 1) / 3
                                   1, 1, 1, 1};  // 0
  const std::vector<double> v = column_sum_variances(test::prompt_end(4, sums), 2);
  ASSERT_EQ(v.size(), 2u);
  EXPECT_NEAR(v[0], 2.0 / 3.0, 1e-12);
  EXPECT_EQ(v[1], 0.0);
}

TEST(D2oAllocation, CodeStatisticIsTheMeanOfMinMaxNormalisedVariances) {
  // v = {2/3, 0, 1/3}: normalised (v - 0) / (2/3 + 1e-6) = {~1, 0, ~0.5}; mean 1 / (3 (2/3 + 1e-6)).
  const std::vector<double> v = {2.0 / 3.0, 0.0, 1.0 / 3.0};
  EXPECT_NEAR(d2o_code_statistic(v, single_rank_collectives()), 0.49999925000112, 1e-13);
  // Equal variances: every head normalises to 0.
  EXPECT_EQ(d2o_code_statistic(std::vector<double>{5, 5}, single_rank_collectives()), 0.0);
  // The paper's metric: the plain mean.
  EXPECT_NEAR(d2o_paper_statistic(v, single_rank_collectives()), 1.0 / 3.0, 1e-15);
}

TEST(D2oAllocation, SoftmaxSharesFromGivenLayerStatistics) {
  // sigma = {0, ln 2, none, 0}: softmax(-sigma) over the 3 layers with one = {0.4, 0.2, 0.4}; times L' = 3 and
  // rho = 0.2: {0.24, 0.12, 0.24}; the layer without a statistic gets none.
  const std::vector<double> shares = d2o_softmax_shares(std::vector<double>{0, std::log(2.0), NAN, 0}, 0.2);
  ASSERT_EQ(shares.size(), 4u);
  EXPECT_NEAR(shares[0], 0.24, 1e-12);
  EXPECT_NEAR(shares[1], 0.12, 1e-12);
  EXPECT_TRUE(std::isnan(shares[2]));
  EXPECT_NEAR(shares[3], 0.24, 1e-12);
}

TEST(D2oAllocation, SoftmaxSharesAreClampedToOnePercentAndTheWholePrompt) {
  // sigma = {0, 10}, rho = 0.9: weights 1 / (1 + e^-10) and e^-10 / (1 + e^-10), times 2 * 0.9: 1.7999 and
  // 8.2e-5, clamped to 1 and 0.01.
  const std::vector<double> shares = d2o_softmax_shares(std::vector<double>{0, 10}, 0.9);
  EXPECT_EQ(shares[0], 1.0);
  EXPECT_EQ(shares[1], 0.01);
  // All layers equal: every layer keeps rho.
  for (double s : d2o_softmax_shares(std::vector<double>(30, 0.37), 0.2)) EXPECT_NEAR(s, 0.2, 1e-12);
}

TEST(D2oAllocation, PaperGate) {
  EXPECT_EQ(d2o_gate_share(150.0, 0.2, 100.0, 2.0), 0.2);  // sparse: S
  EXPECT_NEAR(d2o_gate_share(50.0, 0.2, 100.0, 2.0), 0.4, 1e-15);  // dense: alpha S
  EXPECT_NEAR(d2o_gate_share(100.0, 0.2, 100.0, 3.0), 0.6, 1e-15);  // at the gate: dense
  EXPECT_EQ(d2o_gate_share(50.0, 0.2, 100.0, 8.0), 1.0);  // never more than the prompt
}

TEST(D2oAllocation, BudgetsKeepTheSplitAndOneHeavyHitterBeyondTheSinks) {
  // n = 1001, share 0.24, hh 0.1, recent 0.1: heavy = floor(1001 * 0.12) = 120, recent the same.
  D2oBudget b = d2o_budget(1001, 0.24, 0.1, 0.1, 4);
  EXPECT_EQ(b.heavy, 120);
  EXPECT_EQ(b.recent, 120);
  EXPECT_EQ(b.total(), 240);
  // 3:1 split: share 0.2 of 101 = 15.15 + 5.05 -> 15 and 5.
  b = d2o_budget(101, 0.2, 0.15, 0.05, 4);
  EXPECT_EQ(b.heavy, 15);
  EXPECT_EQ(b.recent, 5);
  // n = 20, share 0.2: floor(2) heavy is below sinks + 1 = 5.
  b = d2o_budget(20, 0.2, 0.1, 0.1, 4);
  EXPECT_EQ(b.heavy, 5);
  EXPECT_EQ(b.recent, 2);
}

TEST(D2oAllocation, StatisticsSplitOverTwoRanksEqualTheOneRankValue) {
  const std::vector<double> all = {0.5, 3.0, 1.25, 0.0, 2.0, 0.75};  // 6 query heads
  const double code = d2o_code_statistic(all, single_rank_collectives());
  const double paper = d2o_paper_statistic(all, single_rank_collectives());
  test::ThreadGroup group(2);
  double got_code[2] = {}, got_paper[2] = {};
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      test::GroupRank self(group, r);
      const std::vector<double> mine(all.begin() + 3 * r, all.begin() + 3 * r + 3);  // heads [3r, 3r + 3)
      got_code[r] = d2o_code_statistic(mine, self);
      got_paper[r] = d2o_paper_statistic(mine, self);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_NEAR(got_code[r], code, 1e-15);
    EXPECT_NEAR(got_paper[r], paper, 1e-15);
  }
  // Averaging per-rank statistics instead would be wrong: each rank would normalise by its own min and max
  // (0.4458 against 0.4167 here).
  const double rank0 = d2o_code_statistic(std::vector<double>(all.begin(), all.begin() + 3), single_rank_collectives());
  const double rank1 = d2o_code_statistic(std::vector<double>(all.begin() + 3, all.end()), single_rank_collectives());
  EXPECT_GT(std::abs(0.5 * (rank0 + rank1) - code), 0.01);
}

}  // namespace
}  // namespace strata
