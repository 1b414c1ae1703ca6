#include "rank/sequence_sampler.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include <gtest/gtest.h>

namespace strata {
namespace {

SamplingRule greedy_params() {
  SamplingRule params;
  params.temperature = 0.0f;
  return params;
}

// log_softmax in double, written independently of the sampler.
std::vector<double> log_softmax(const std::vector<float>& logits) {
  double max = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (float x : logits) sum += std::exp(x - max);
  std::vector<double> out;
  for (float x : logits) out.push_back(x - max - std::log(sum));
  return out;
}

// The distribution the filters should leave, by full sort in double: softmax(x / T), keep the top_k, the smallest
// prefix with mass >= top_p of what is left, then p >= min_p * p(max); renormalised.
std::map<int32_t, double> filtered_distribution(const std::vector<float>& logits, const SamplingRule& params) {
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  if (params.top_k > 0) ids.resize(std::min<size_t>(ids.size(), params.top_k));
  std::vector<double> p;
  for (int32_t id : ids) p.push_back(std::exp((logits[id] - logits[ids[0]]) / params.temperature));
  double total = std::accumulate(p.begin(), p.end(), 0.0);
  size_t n = 0;
  for (double cumulative = 0.0; n < p.size() && cumulative < params.top_p * total; ++n) cumulative += p[n];
  std::map<int32_t, double> kept;
  for (size_t i = 0; i < n; ++i) {
    if (p[i] >= params.min_p * p[0]) kept[ids[i]] = p[i];
  }
  double kept_total = 0.0;
  for (const auto& [id, q] : kept) kept_total += q;
  for (auto& [id, q] : kept) q /= kept_total;
  return kept;
}

std::vector<int32_t> draw_many(const SamplingRule& params, uint64_t seed, const std::vector<float>& logits,
                               int n_draws) {
  SequenceSampler sampler(params, seed);
  std::vector<int32_t> ids;
  for (int i = 0; i < n_draws; ++i) {
    std::vector<float> row = logits;
    ids.push_back(sampler.sample(row).id);
  }
  return ids;
}

std::set<int32_t> distinct(const std::vector<int32_t>& ids) { return {ids.begin(), ids.end()}; }

std::vector<float> log_probs(const std::vector<double>& probs) {
  std::vector<float> logits;
  for (double p : probs) logits.push_back(static_cast<float>(std::log(p)));
  return logits;
}

std::vector<float> random_logits(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(n);
  for (float& x : logits) x = normal(rng);
  return logits;
}

TEST(SamplerTest, GreedyTakesArgmaxAndLowestIdOnTies) {
  SequenceSampler sampler(greedy_params(), 1);
  std::vector<float> logits = {0.5f, 3.0f, -1.0f, 3.0f, 2.9f};
  EXPECT_EQ(sampler.sample(logits).id, 1);
}

TEST(SamplerTest, GreedyIgnoresTheSeed) {
  std::vector<float> logits = random_logits(1000, 7);
  EXPECT_EQ(draw_many(greedy_params(), 1, logits, 5), draw_many(greedy_params(), 2, logits, 5));
}

TEST(SamplerTest, PenaltiesApplyToGeneratedCounts) {
  SamplingRule params = greedy_params();
  params.presence_penalty = 0.5f;
  params.frequency_penalty = 0.25f;
  params.n_logprobs = 4;
  SequenceSampler sampler(params, 1);
  sampler.accept(2);
  sampler.accept(2);
  sampler.accept(0);
  // Token 0: 1 - 0.5 - 0.25 = 0.25; token 2: 3 - 0.5 - 2 * 0.25 = 2; tokens 1 and 3 are untouched.
  std::vector<float> logits = {1.0f, 2.0f, 3.0f, 0.5f};
  RowSample result = sampler.sample(logits);
  EXPECT_EQ(result.id, 1);  // ties with token 2 at 2.0: the lower id

  std::vector<double> expected = log_softmax({0.25f, 2.0f, 2.0f, 0.5f});
  ASSERT_EQ(result.top.size(), 4u);
  std::vector<int32_t> expected_order = {1, 2, 3, 0};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(result.top[i].id, expected_order[i]);
    EXPECT_NEAR(result.top[i].logprob, expected[expected_order[i]], 1e-6);
  }
  EXPECT_NEAR(result.logprob, expected[1], 1e-6);
}

TEST(SamplerTest, PenaltiesAccumulateOverAcceptedTokens) {
  SamplingRule params = greedy_params();
  params.frequency_penalty = 1.0f;
  SequenceSampler sampler(params, 1);
  std::vector<float> logits = {5.0f, 3.5f};
  std::vector<int32_t> ids;
  for (int i = 0; i < 4; ++i) {
    std::vector<float> row = logits;
    ids.push_back(sampler.sample(row).id);
    sampler.accept(ids.back());
  }
  // Token 0 wins until its two uses bring it to 3 < 3.5; then token 1 wins and drops to 2.5 < 3.
  EXPECT_EQ(ids, (std::vector<int32_t>{0, 0, 1, 0}));
}

TEST(SamplerTest, TopKOneEqualsGreedy) {
  std::vector<float> logits = random_logits(5000, 3);
  logits[4321] = logits[1234] = *std::max_element(logits.begin(), logits.end()) + 0.1f;
  SamplingRule params;
  params.temperature = 1.5f;
  params.top_k = 1;
  for (int32_t id : draw_many(params, 99, logits, 200)) EXPECT_EQ(id, 1234);
}

TEST(SamplerTest, TopPKeepsTheSmallestSetReachingP) {
  std::vector<float> logits = log_probs({0.05, 0.5, 0.1, 0.2, 0.15});
  SamplingRule params;
  params.top_p = 0.69f;  // 0.5 + 0.2 = 0.7 >= 0.69
  EXPECT_EQ(distinct(draw_many(params, 5, logits, 2000)), (std::set<int32_t>{1, 3}));
  params.top_p = 0.75f;  // 0.7 < 0.75: token 4 (0.15) is needed too
  EXPECT_EQ(distinct(draw_many(params, 5, logits, 2000)), (std::set<int32_t>{1, 3, 4}));
}

TEST(SamplerTest, TopPIsRelativeToTheTopKSet) {
  std::vector<float> logits = log_probs({0.5, 0.2, 0.15, 0.1, 0.05});
  SamplingRule params;
  params.top_p = 0.8f;  // over all tokens: 0.5, 0.7, 0.85 -> three tokens
  EXPECT_EQ(distinct(draw_many(params, 5, logits, 2000)), (std::set<int32_t>{0, 1, 2}));
  params.top_k = 3;  // renormalised over three: 0.588, 0.824 -> two tokens
  EXPECT_EQ(distinct(draw_many(params, 5, logits, 2000)), (std::set<int32_t>{0, 1}));
}

TEST(SamplerTest, TopPHandlesANucleusOfThousands) {
  // Equal logits: most-likely-first order is by id, and half the mass is exactly the lower half of the ids.
  std::vector<float> logits(49152, 0.25f);
  SamplingRule params;
  params.top_p = 0.5f;
  std::vector<int32_t> ids = draw_many(params, 11, logits, 500);
  EXPECT_LT(*std::max_element(ids.begin(), ids.end()), 24576);
  EXPECT_GT(*std::max_element(ids.begin(), ids.end()), 20000);
}

TEST(SamplerTest, MinPDropsTokensBelowAFractionOfTheMax) {
  std::vector<float> logits = log_probs({0.5, 0.2, 0.15, 0.1, 0.05});
  SamplingRule params;
  params.min_p = 0.25f;  // threshold 0.125
  EXPECT_EQ(distinct(draw_many(params, 5, logits, 2000)), (std::set<int32_t>{0, 1, 2}));
  params.min_p = 0.35f;  // threshold 0.175
  EXPECT_EQ(distinct(draw_many(params, 5, logits, 2000)), (std::set<int32_t>{0, 1}));
}

TEST(SamplerTest, LogprobsMatchLogSoftmaxAtTemperatureOne) {
  std::vector<float> logits = random_logits(1000, 5);
  float max = *std::max_element(logits.begin(), logits.end());
  logits[20] = logits[10] = max + 1.0f;  // a tie at the top: the lower id comes first
  std::vector<double> expected = log_softmax(logits);

  SamplingRule params;
  params.temperature = 0.7f;  // logprobs do not depend on it
  params.n_logprobs = 5;
  SequenceSampler sampler(params, 3);
  std::vector<float> row = logits;
  RowSample result = sampler.sample(row);
  EXPECT_NEAR(result.logprob, expected[result.id], 1e-5);

  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return expected[a] > expected[b]; });
  ASSERT_EQ(result.top.size(), 5u);
  EXPECT_EQ(result.top[0].id, 10);
  EXPECT_EQ(result.top[1].id, 20);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(result.top[i].id, order[i]);
    EXPECT_NEAR(result.top[i].logprob, expected[order[i]], 1e-5);
  }
}

TEST(SamplerTest, ZeroLogprobsGivesOnlyTheChosenToken) {
  SamplingRule params = greedy_params();
  params.n_logprobs = 0;
  SequenceSampler sampler(params, 1);
  std::vector<float> logits = {0.0f, std::log(3.0f)};
  RowSample result = sampler.sample(logits);
  EXPECT_EQ(result.id, 1);
  EXPECT_NEAR(result.logprob, std::log(0.75), 1e-6);
  EXPECT_TRUE(result.top.empty());
}

TEST(SamplerTest, EmpiricalFrequenciesMatchTheFilteredDistribution) {
  // Each filter removes something: top_k drops token 5, top_p token 4, min_p token 3 (see filtered_distribution).
  std::vector<float> logits = {2.0f, 1.5f, 1.2f, 0.3f, 0.0f, -1.0f, 1.4f};
  SamplingRule params;
  params.temperature = 0.8f;
  params.top_k = 6;
  params.top_p = 0.95f;
  params.min_p = 0.15f;
  std::map<int32_t, double> expected = filtered_distribution(logits, params);
  ASSERT_EQ(expected.size(), 4u);

  const int n_draws = 20000;
  std::map<int32_t, int> counts;
  for (int32_t id : draw_many(params, 2024, logits, n_draws)) ++counts[id];
  double chi_square = 0.0;
  for (const auto& [id, count] : counts) {
    ASSERT_TRUE(expected.count(id)) << "token " << id << " should have been filtered out";
  }
  for (const auto& [id, p] : expected) {
    double want = p * n_draws;
    chi_square += (counts[id] - want) * (counts[id] - want) / want;
  }
  EXPECT_LT(chi_square, 16.27);  // the 0.999 quantile of chi-square with 3 degrees of freedom
}

// What the host hands to the backend: the penalties from the accepted tokens' counts, and one uniform number per
// token drawn at temperature > 0 from the sequence's RNG (53 bits, so it is in [0, 1)); greedy leaves the RNG as
// it is, so a sequence that switches nothing draws the same numbers whatever came before.
// logit_bias (as negated penalties, ascending ids) adds to the counts' penalties of the same token: one entry per id,
// which every backend requires (check_penalties).
TEST(SamplerTest, LogitBiasAddsToThePenaltiesOfTheSameToken) {
  SamplingRule params = greedy_params();
  params.frequency_penalty = 1.0f;
  params.logit_bias = {{1, -4.0f}, {3, 2.5f}};  // token 1: +4, token 3: -2.5
  params.n_logprobs = 4;
  SequenceSampler sampler(params, 1);
  sampler.accept(1);
  sampler.accept(2);
  const RowSampling s = sampler.next();
  std::map<int32_t, float> penalties;
  for (const TokenPenalty& p : s.penalties) penalties[p.id] = p.amount;
  EXPECT_EQ(s.penalties.size(), penalties.size()) << "an id twice";
  EXPECT_EQ(penalties, (std::map<int32_t, float>{{1, -3.0f}, {2, 1.0f}, {3, 2.5f}}));
  // Logits 5, 1, 4, 6 become 5, 4, 3, 3.5: token 0 wins, and the logprobs see the bias.
  std::vector<float> logits = {5.0f, 1.0f, 4.0f, 6.0f};
  const RowSample result = sampler.sample(logits);
  EXPECT_EQ(result.id, 0);
  const std::vector<double> expected = log_softmax({5.0f, 4.0f, 3.0f, 3.5f});
  ASSERT_EQ(result.top.size(), 4u);
  EXPECT_EQ(result.top[1].id, 1);
  EXPECT_NEAR(result.top[1].logprob, expected[1], 1e-6);
  SequenceSampler biased_only([] {
    SamplingRule p = greedy_params();
    p.logit_bias = {{0, 100.0f}};
    return p;
  }(), 1);
  std::vector<float> row = {50.0f, 1.0f};
  EXPECT_EQ(biased_only.sample(row).id, 1) << "a bias of -100 rules token 0 out";
}

TEST(SamplerTest, NextCarriesThePenaltiesAndOneUniformPerDraw) {
  SamplingRule params;
  params.temperature = 0.9f;
  params.top_k = 40;
  params.top_p = 0.95f;
  params.min_p = 0.02f;
  params.n_logprobs = 2;
  params.presence_penalty = 0.5f;
  params.frequency_penalty = 0.25f;
  SequenceSampler sampler(params, 77);
  sampler.accept(9);
  sampler.accept(9);
  sampler.accept(4);
  const RowSampling s = sampler.next();
  EXPECT_EQ(s.temperature, 0.9f);
  EXPECT_EQ(s.top_k, 40);
  EXPECT_EQ(s.top_p, 0.95f);
  EXPECT_EQ(s.min_p, 0.02f);
  EXPECT_EQ(s.n_logprobs, 2);
  std::map<int32_t, float> penalties;
  for (const TokenPenalty& p : s.penalties) penalties[p.id] = p.amount;
  EXPECT_EQ(penalties, (std::map<int32_t, float>{{4, 0.75f}, {9, 1.0f}}));

  std::mt19937_64 rng(77);
  const double first = static_cast<double>(rng() >> 11) * 0x1.0p-53;
  const double second = static_cast<double>(rng() >> 11) * 0x1.0p-53;
  EXPECT_EQ(s.uniform, first);
  EXPECT_EQ(sampler.next().uniform, second);

  SequenceSampler greedy(greedy_params(), 77);
  EXPECT_EQ(greedy.next().uniform, 0.0);
  EXPECT_TRUE(greedy.next().penalties.empty());
}

// The step's mask rides on the sampling next() returns, and sample() obeys it.
TEST(SamplerTest, NextCarriesTheStepsMask) {
  SequenceSampler sampler(greedy_params(), 5);
  EXPECT_TRUE(sampler.next().allowed.empty());
  const std::vector<uint64_t> mask = {0b1010};  // tokens 1 and 3 of 4
  const RowSampling s = sampler.next(mask);
  EXPECT_EQ(s.allowed.data(), mask.data());
  EXPECT_EQ(s.allowed.size(), 1u);
  std::vector<float> row = {9.0f, 1.0f, 8.0f, 2.0f};
  EXPECT_EQ(sampler.sample(row, mask).id, 3);
}

TEST(SamplerTest, SameSeedSameSequenceDifferentSeedsDiffer) {
  std::vector<float> logits = random_logits(1000, 9);
  for (float& x : logits) x *= 0.1f;  // flat enough that many tokens are likely
  SamplingRule params;
  params.top_p = 0.9f;
  std::vector<int32_t> a = draw_many(params, 42, logits, 100);
  EXPECT_EQ(a, draw_many(params, 42, logits, 100));
  EXPECT_NE(a, draw_many(params, 43, logits, 100));
}

}  // namespace
}  // namespace strata
