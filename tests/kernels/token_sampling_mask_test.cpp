// Masks in the sampling rule (kernels/token_sampling.h, step 0) on the host: sample_row_on_host against references
// written here in double over the allowed tokens only. Greedy takes the best allowed token, draws never take a
// masked one, the filters and the logprobs see only the allowed tokens, and malformed masks are refused.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/token_sampling.h"
#include "tests/kernels/random_token_mask.h"

namespace strata {
namespace {

using test::random_mask;

std::vector<float> random_logits(int64_t cols, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> x(static_cast<size_t>(cols));
  for (float& v : x) v = normal(rng);
  return x;
}

std::vector<uint64_t> mask_of(int64_t cols, const std::vector<int32_t>& allowed) {
  std::vector<uint64_t> mask(size_t(mask_words(cols)), 0);
  for (int32_t id : allowed) mask_set(mask, id);
  return mask;
}

// The allowed ids, most likely first (the lower id among equal logits).
std::vector<int32_t> allowed_in_order(const std::vector<float>& x, const std::vector<uint64_t>& mask) {
  std::vector<int32_t> ids;
  for (int32_t id = 0; id < int32_t(x.size()); ++id) {
    if (mask_has(mask, id)) ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); });
  return ids;
}

// The rule's draw over the allowed tokens in double, by full sort; nullopt when a cut or the uniform number lies
// within 1e-9 of a boundary, where float rounding may decide.
std::optional<int32_t> reference_draw(const std::vector<float>& x, const std::vector<uint64_t>& mask,
                                      const RowSampling& s) {
  std::vector<int32_t> ids = allowed_in_order(x, mask);
  if (s.top_k > 0 && size_t(s.top_k) < ids.size()) ids.resize(size_t(s.top_k));
  std::vector<double> w;
  for (int32_t id : ids) w.push_back(std::exp((double(x[id]) - x[ids[0]]) / s.temperature));
  const double total = std::accumulate(w.begin(), w.end(), 0.0);
  size_t kept = ids.size();
  if (s.top_p < 1.0f) {
    double cumulative = 0.0;
    for (kept = 0; kept < ids.size() && cumulative < s.top_p * total; ++kept) {
      cumulative += w[kept];
      if (std::fabs(cumulative - s.top_p * total) < 1e-9 * total) return std::nullopt;
    }
  }
  std::vector<std::pair<int32_t, double>> by_id;
  for (size_t i = 0; i < kept; ++i) {
    if (s.min_p > 0.0f && std::fabs(w[i] - s.min_p) < 1e-9) return std::nullopt;
    if (w[i] >= s.min_p) by_id.emplace_back(ids[i], w[i]);
  }
  std::sort(by_id.begin(), by_id.end());
  double kept_total = 0.0;
  for (const auto& [id, weight] : by_id) kept_total += weight;
  double cumulative = 0.0;
  for (const auto& [id, weight] : by_id) {
    cumulative += weight;
    if (std::fabs(cumulative / kept_total - s.uniform) < 1e-9) return std::nullopt;
    if (cumulative / kept_total > s.uniform) return id;
  }
  return by_id.back().first;
}

// log_softmax over the allowed tokens, in double; -inf elsewhere.
std::vector<double> masked_log_softmax(const std::vector<float>& x, const std::vector<uint64_t>& mask) {
  double max = -INFINITY;
  for (size_t id = 0; id < x.size(); ++id) {
    if (mask_has(mask, int64_t(id))) max = std::max(max, double(x[id]));
  }
  double sum = 0.0;
  for (size_t id = 0; id < x.size(); ++id) {
    if (mask_has(mask, int64_t(id))) sum += std::exp(double(x[id]) - max);
  }
  std::vector<double> out(x.size(), -INFINITY);
  for (size_t id = 0; id < x.size(); ++id) {
    if (mask_has(mask, int64_t(id))) out[id] = double(x[id]) - max - std::log(sum);
  }
  return out;
}

RowSample sample(std::vector<float> x, const std::vector<uint64_t>& mask, RowSampling s) {
  s.allowed = mask;
  return sample_row_on_host(x, s);
}

// The layout the grammar, the step message and every backend share (kernels/token_mask_layout.h), bit by bit.
TEST(TokenMaskLayout, TokenIdIsBitIdMod64OfWordIdDiv64) {
  std::vector<uint64_t> mask(size_t(mask_words(130)), 0);
  ASSERT_EQ(mask.size(), 3u);
  for (int64_t id : {0, 70, 129}) mask_set(mask, id);
  EXPECT_EQ(mask, (std::vector<uint64_t>{1, uint64_t{1} << 6, 2}));
  EXPECT_TRUE(mask_has(mask, 70));
  EXPECT_FALSE(mask_has(mask, 71));
  mask_clear(mask, 70);
  EXPECT_EQ(mask[1], 0u);
}

// Across word boundaries (1, 63, 64, 65 columns) and up to a vocabulary; sparse masks, dense ones, one that leaves
// out the unmasked argmax, and equal maxima among the allowed tokens.
TEST(MaskedSampling, GreedyTakesTheBestAllowedToken) {
  std::mt19937 rng(7);
  for (int64_t cols : {int64_t(1), int64_t(63), int64_t(64), int64_t(65), int64_t(1000), int64_t(49152)}) {
    for (double density : {0.002, 0.5, 0.95}) {
      std::vector<float> x = random_logits(cols, rng);
      const int64_t best = std::max_element(x.begin(), x.end()) - x.begin();
      std::vector<uint64_t> mask = random_mask(cols, density, (best + 1) % cols, rng);
      if (cols > 1) mask_clear(mask, best);
      const std::vector<int32_t> order = allowed_in_order(x, mask);
      ASSERT_FALSE(order.empty());
      EXPECT_EQ(sample(x, mask, RowSampling{}).id, order[0]) << "cols " << cols << ", density " << density;
      if (order.size() > 2) {  // the first allowed token's logit on a later allowed token: the lower id wins
        const int32_t a = order[0], b = order[order.size() / 2];
        x[size_t(b)] = x[size_t(a)];
        EXPECT_EQ(sample(x, mask, RowSampling{}).id, std::min(a, b)) << "cols " << cols << ", tie";
      }
    }
  }
}

TEST(MaskedSampling, DrawsNeverTakeAMaskedToken) {
  std::mt19937 rng(11);
  const int64_t cols = 1000;
  const std::vector<float> x = random_logits(cols, rng);
  const std::vector<uint64_t> mask = random_mask(cols, 0.1, 3, rng);
  std::set<int32_t> drawn;
  for (float temperature : {0.5f, 1.0f, 3.0f}) {
    for (int i = 0; i < 2000; ++i) {
      RowSampling s;
      s.temperature = temperature;
      s.uniform = i == 1999 ? std::nextafter(1.0, 0.0) : i / 2000.0;
      const int32_t id = sample(x, mask, s).id;
      ASSERT_TRUE(mask_has(mask, id)) << "T " << temperature << ", u " << s.uniform << " drew masked " << id;
      drawn.insert(id);
    }
  }
  EXPECT_GT(drawn.size(), 10u) << "the draws should spread over the allowed tokens";
}

// Logits 10, 9, ..., 3 with tokens 1, 3, 5 and 6 allowed: their weights at T = 1 are e^0, e^-2, e^-4, e^-5
// (probabilities 0.859, 0.116, 0.016, 0.006). Every filter counts from the allowed tokens: unmasked, top_k 2 would
// keep tokens 0 and 1.
TEST(MaskedSampling, FiltersActOnTheMaskedDistribution) {
  const std::vector<float> x = {10, 9, 8, 7, 6, 5, 4, 3};
  const std::vector<uint64_t> mask = mask_of(8, {1, 3, 5, 6});
  const auto drawn = [&](int top_k, float top_p, float min_p) {
    std::set<int32_t> ids;
    RowSampling s;
    s.temperature = 1.0f;
    s.top_k = top_k, s.top_p = top_p, s.min_p = min_p;
    for (int i = 0; i < 1000; ++i) {
      s.uniform = i / 1000.0;
      ids.insert(sample(x, mask, s).id);
    }
    return ids;
  };
  EXPECT_EQ(drawn(0, 1.0f, 0.0f), (std::set<int32_t>{1, 3, 5, 6}));
  EXPECT_EQ(drawn(2, 1.0f, 0.0f), (std::set<int32_t>{1, 3}));
  EXPECT_EQ(drawn(3, 1.0f, 0.0f), (std::set<int32_t>{1, 3, 5}));
  EXPECT_EQ(drawn(0, 0.9f, 0.0f), (std::set<int32_t>{1, 3}));
  EXPECT_EQ(drawn(0, 0.98f, 0.0f), (std::set<int32_t>{1, 3, 5}));
  EXPECT_EQ(drawn(0, 1.0f, 0.1f), (std::set<int32_t>{1, 3}));
  EXPECT_EQ(drawn(0, 1.0f, 0.01f), (std::set<int32_t>{1, 3, 5}));
  EXPECT_EQ(drawn(20, 1.0f, 0.0f), (std::set<int32_t>{1, 3, 5, 6})) << "top_k beyond the allowed tokens";
}

// Random rows, masks and filters against the double reference, away from its boundaries.
TEST(MaskedSampling, DrawsFollowTheReferenceOverTheAllowedTokens) {
  std::mt19937 rng(23);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  int compared = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t cols = std::vector<int64_t>{70, 500, 4096}[trial % 3];
    const std::vector<float> x = random_logits(cols, rng);
    const std::vector<uint64_t> mask = random_mask(cols, std::vector<double>{0.01, 0.3, 0.9}[(trial / 3) % 3], 5, rng);
    RowSampling s;
    s.temperature = std::vector<float>{0.6f, 1.0f, 1.7f}[trial % 3];
    s.top_k = std::vector<int>{0, 1, 5, 40}[trial % 4];
    s.top_p = std::vector<float>{1.0f, 0.5f, 0.9f, 1.0f, 0.95f}[trial % 5];
    s.min_p = std::vector<float>{0.0f, 0.05f}[trial % 2];
    s.uniform = uniform(rng);
    const std::optional<int32_t> expected = reference_draw(x, mask, s);
    if (!expected) continue;
    ++compared;
    EXPECT_EQ(sample(x, mask, s).id, *expected) << "trial " << trial << ", cols " << cols;
  }
  EXPECT_GT(compared, 290);
}

// The chosen token's logprob and the top n from a log_softmax over the allowed tokens; fewer than n when the mask
// allows fewer.
TEST(MaskedSampling, LogprobsAreALogSoftmaxOverTheAllowedTokens) {
  std::mt19937 rng(31);
  const int64_t cols = 1000;
  const std::vector<float> x = random_logits(cols, rng);
  for (double density : {0.003, 0.2}) {
    const std::vector<uint64_t> mask = random_mask(cols, density, 500, rng);
    const std::vector<double> expected = masked_log_softmax(x, mask);
    const std::vector<int32_t> order = allowed_in_order(x, mask);
    for (float temperature : {0.0f, 1.0f}) {
      RowSampling s;
      s.temperature = temperature;
      s.uniform = 0.4;
      s.n_logprobs = 20;
      const RowSample got = sample(x, mask, s);
      EXPECT_NEAR(got.logprob, expected[size_t(got.id)], 1e-5);
      ASSERT_EQ(got.top.size(), std::min<size_t>(20, order.size())) << "density " << density;
      for (size_t j = 0; j < got.top.size(); ++j) {
        EXPECT_EQ(got.top[j].id, order[j]) << "top " << j;
        EXPECT_NEAR(got.top[j].logprob, expected[size_t(order[j])], 1e-5) << "top " << j;
      }
    }
  }
}

TEST(MaskedSampling, AOneTokenMaskAlwaysTakesThatToken) {
  std::mt19937 rng(43);
  const int64_t cols = 1000;
  std::vector<float> x = random_logits(cols, rng);
  x[777] = -50.0f;  // the least likely token by far
  const std::vector<uint64_t> mask = mask_of(cols, {777});
  for (float temperature : {0.0f, 0.3f, 1.0f}) {
    for (int top_k : {0, 1, 50}) {
      for (double u : {0.0, 0.5, std::nextafter(1.0, 0.0)}) {
        RowSampling s;
        s.temperature = temperature, s.top_k = top_k, s.top_p = 0.5f, s.min_p = 0.1f, s.uniform = u;
        s.n_logprobs = 3;
        const RowSample got = sample(x, mask, s);
        EXPECT_EQ(got.id, 777) << "T " << temperature << ", top_k " << top_k << ", u " << u;
        EXPECT_EQ(got.logprob, 0.0f);
        ASSERT_EQ(got.top.size(), 1u);
        EXPECT_EQ(got.top[0].id, 777);
      }
    }
  }
}

// A penalty that would lift a masked token to the top leaves it at -inf, in the row and in the choice.
TEST(MaskedSampling, PenaltiesOnMaskedTokensAreHarmless) {
  std::vector<float> x = {1.0f, 2.0f, 3.0f, 4.0f};
  const std::vector<uint64_t> mask = mask_of(4, {0, 2});
  const std::vector<TokenPenalty> penalties = {{3, -100.0f}, {1, 5.0f}, {0, -0.5f}};
  RowSampling s;
  s.penalties = penalties;
  s.allowed = mask;
  EXPECT_EQ(sample_row_on_host(x, s).id, 2);
  EXPECT_EQ(x, (std::vector<float>{1.5f, -INFINITY, 3.0f, -INFINITY}));
}

TEST(MaskedSampling, AMaskOfTheWrongSizeOrAllowingNothingIsRefused) {
  const int64_t cols = 100;  // two words
  std::vector<float> x(size_t(cols), 0.0f);
  const auto refused = [&](const std::vector<uint64_t>& mask, const std::string& what) {
    RowSampling s;
    s.allowed = mask;
    try {
      sample_row_on_host(x, s);
      ADD_FAILURE() << what << ": accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  refused({~uint64_t(0)}, "1 words for 100 columns");
  refused({~uint64_t(0), ~uint64_t(0), ~uint64_t(0)}, "3 words for 100 columns");
  refused({0, 0}, "allows no token");
  refused({0, ~uint64_t(0) << 36}, "allows no token");  // only bits past column 99
  try {
    check_mask(std::vector<uint64_t>{0, 0}, cols, 4);
    ADD_FAILURE() << "accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("row 4"), std::string::npos) << e.what();
  }
  EXPECT_EQ(check_mask({}, cols), cols);
  EXPECT_EQ(check_mask(std::vector<uint64_t>{~uint64_t(0), ~uint64_t(0)}, cols), cols);
  EXPECT_EQ(check_mask(std::vector<uint64_t>{~uint64_t(0), ~uint64_t(0)}, 128), 128);
  EXPECT_EQ(check_mask(std::vector<uint64_t>{0, uint64_t(1) << 35}, cols), 1);
}

}  // namespace
}  // namespace strata
