// Expected Attention (cache/policies/expected_attention_policy.cpp) against the paper's definition computed
// here another way, in double: the RoPE rotation matrices R(p) built whole for every future position and averaged,
// mean and covariance by two passes over the stored queries, the scores by explicit sums. Keys and values come
// from a host LayerKeys that answers the key forms exactly. Then what surrounds the scoring: the sinks, a prompt
// within the budget, budgets as fractions, chunked prefill, parameters.
#include <cmath>
#include <cstdint>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cache/policies/policies.h"
#include "tests/cache/policy_test_states.h"

namespace strata {
namespace {

using Matrix = std::vector<std::vector<double>>;  // [rows][cols]
using Ids = std::vector<int32_t>;

// One layer's prompt: queries before RoPE [row][head][dim], keys (as cached, after RoPE) and values
// [kv_head][entry][dim], random and reproducible.
struct Layer {
  int n_heads, n_kv_heads, d, n;
  std::vector<std::vector<std::vector<float>>> q;     // [row][head][dim]
  std::vector<std::vector<std::vector<float>>> k, v;  // [kv_head][entry][dim]

  Layer(int n_heads, int n_kv_heads, int d, int n, unsigned seed) : n_heads(n_heads), n_kv_heads(n_kv_heads), d(d), n(n) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    // Queries with a mean per head (as real queries have) and unequal spreads per dimension.
    q.assign(size_t(n), std::vector<std::vector<float>>(size_t(n_heads), std::vector<float>(size_t(d))));
    for (int r = 0; r < n; ++r)
      for (int h = 0; h < n_heads; ++h)
        for (int i = 0; i < d; ++i) q[r][h][i] = 0.8f * float((i + h) % 3) - 0.5f + (0.3f + 0.1f * (i % 4)) * normal(rng);
    k.assign(size_t(n_kv_heads), std::vector<std::vector<float>>(size_t(n), std::vector<float>(size_t(d))));
    v = k;
    for (int g = 0; g < n_kv_heads; ++g)
      for (int e = 0; e < n; ++e)
        for (int i = 0; i < d; ++i) {
          k[g][e][i] = normal(rng);
          v[g][e][i] = (1.0f + 0.5f * float(e % 5)) * normal(rng);
        }
  }

  QueryMoments moments(int from) const {
    QueryMoments m(n_heads, d);
    std::vector<float> rows;
    for (int r = from; r < n; ++r)
      for (int h = 0; h < n_heads; ++h) rows.insert(rows.end(), q[r][h].begin(), q[r][h].end());
    m.add_rows(rows.data(), n - from, int64_t(n_heads) * d);
    return m;
  }
};

// The layer's keys and values on the host; forms in double, the first value_norms.size() entries.
class HostKeys final : public LayerKeys {
 public:
  explicit HostKeys(const Layer& layer) : layer_(layer) {}
  void nearest(int, std::span<const int32_t>, std::span<const int32_t>, std::span<float>,
               std::span<int32_t>) const override {
    throw std::logic_error("HostKeys: no nearest keys");
  }
  void key_forms(int kv_head, std::span<const float> linear, std::span<const float> quadratic,
                 std::span<float> forms, std::span<float> value_norms) const override {
    const int d = layer_.d, n = int(value_norms.size()), m = int(linear.size()) / d;
    for (int e = 0; e < n; ++e) {
      const std::vector<float>& k = layer_.k[kv_head][e];
      const std::vector<float>& v = layer_.v[kv_head][e];
      value_norms[e] = float(std::sqrt(std::inner_product(v.begin(), v.end(), v.begin(), 0.0)));
      for (int j = 0; j < m; ++j) {
        double f = 0.0;
        for (int a = 0; a < d; ++a) {
          f += double(linear[j * d + a]) * k[a];
          for (int b = 0; b < d; ++b) f += double(k[a]) * quadratic[(int64_t(j) * d + a) * d + b] * k[b];
        }
        forms[size_t(j) * n + e] = float(f);
      }
    }
  }

 private:
  const Layer& layer_;
};

Matrix multiply(const Matrix& a, const Matrix& b) {
  Matrix c(a.size(), std::vector<double>(b[0].size(), 0.0));
  for (size_t i = 0; i < a.size(); ++i)
    for (size_t k = 0; k < b.size(); ++k)
      for (size_t j = 0; j < b[0].size(); ++j) c[i][j] += a[i][k] * b[k][j];
  return c;
}

Matrix transpose(const Matrix& a) {
  Matrix t(a[0].size(), std::vector<double>(a.size()));
  for (size_t i = 0; i < a.size(); ++i)
    for (size_t j = 0; j < a[0].size(); ++j) t[j][i] = a[i][j];
  return t;
}

// RoPE at position p as a whole matrix, GGUF's interleaved pairs (2i, 2i + 1) with theta_i = base^(-2i / d).
Matrix rope_matrix(int d, int p, double base) {
  Matrix r(size_t(d), std::vector<double>(size_t(d), 0.0));
  for (int i = 0; i < d / 2; ++i) {
    const double angle = p * std::pow(base, -2.0 * i / d);
    r[2 * i][2 * i] = std::cos(angle);
    r[2 * i][2 * i + 1] = -std::sin(angle);
    r[2 * i + 1][2 * i] = std::sin(angle);
    r[2 * i + 1][2 * i + 1] = std::cos(angle);
  }
  return r;
}

// The definition: [kv_head][entry] scores of the entries after the sinks.
std::vector<std::vector<double>> reference_scores(const Layer& L, int sinks, int point, int future, bool covariance,
                                                  bool vnorm) {
  Matrix rbar(size_t(L.d), std::vector<double>(size_t(L.d), 0.0));
  for (int p = point; p < point + future; ++p) {
    const Matrix r = rope_matrix(L.d, p, 10000.0);
    for (int i = 0; i < L.d; ++i)
      for (int j = 0; j < L.d; ++j) rbar[i][j] += r[i][j] / future;
  }
  const int group = L.n_heads / L.n_kv_heads, m = L.n - sinks;
  std::vector<std::vector<double>> scores(size_t(L.n_kv_heads), std::vector<double>(size_t(m), 0.0));
  for (int h = 0; h < L.n_heads; ++h) {
    Matrix mu(size_t(L.d), std::vector<double>(1, 0.0));
    for (int r = sinks; r < L.n; ++r)
      for (int i = 0; i < L.d; ++i) mu[i][0] += double(L.q[r][h][i]) / m;
    Matrix sigma(size_t(L.d), std::vector<double>(size_t(L.d), 0.0));
    for (int r = sinks; r < L.n; ++r)
      for (int i = 0; i < L.d; ++i)
        for (int j = 0; j < L.d; ++j) sigma[i][j] += (L.q[r][h][i] - mu[i][0]) * (L.q[r][h][j] - mu[j][0]) / m;
    const Matrix mubar = multiply(rbar, mu), sigmabar = multiply(multiply(rbar, sigma), transpose(rbar));
    const int g = h / group;
    std::vector<double> z(static_cast<size_t>(m));
    for (int e = sinks; e < L.n; ++e) {
      const std::vector<float>& k = L.k[g][e];
      double lin = 0.0, quad = 0.0;
      for (int i = 0; i < L.d; ++i) {
        lin += mubar[i][0] * k[i];
        for (int j = 0; j < L.d; ++j) quad += k[i] * sigmabar[i][j] * k[j];
      }
      z[e - sinks] = lin / std::sqrt(double(L.d)) + (covariance ? quad / (2.0 * L.d) : 0.0);
    }
    double total = 0.0;
    for (double x : z) total += std::exp(x);
    for (int e = 0; e < m; ++e) scores[g][e] += std::exp(z[e]) / total / group;
  }
  for (int g = 0; g < L.n_kv_heads; ++g)
    for (int e = 0; e < m; ++e) {
      const std::vector<float>& v = L.v[g][e + sinks];
      if (vnorm) scores[g][e] *= std::sqrt(std::inner_product(v.begin(), v.end(), v.begin(), 0.0));
    }
  return scores;
}

// The sinks, then the top `keep` of the scores (higher first, then the lower index), ascending.
Ids reference_kept(const std::vector<double>& scores, int sinks, int keep) {
  Ids order(scores.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return scores[a] > scores[b]; });
  Ids kept;
  for (int j = 0; j < sinks; ++j) kept.push_back(j);
  Ids top(order.begin(), order.begin() + keep);
  std::sort(top.begin(), top.end());
  for (int32_t e : top) kept.push_back(e + sinks);
  return kept;
}

std::unique_ptr<CompressionPolicy> expected_attention(const std::string& params, int n_heads, int n_kv_heads,
                                                      bool chunked = false) {
  PolicyContext context = test::policy_context(n_heads, n_kv_heads);
  context.prefill_chunk = chunked ? 40 : 0;
  return make_expected_attention_policy(parse_policy_spec("expected_attention" + (params.empty() ? "" : ":" + params)),
                                        context);
}

// A state at the end of the layer's prompt, with its moments and keys.
LayerState end_state(const Layer& layer, const QueryMoments& moments, const LayerKeys& keys) {
  LayerState s = test::at(layer.n, layer.n, 0, {}, &keys);
  s.query_moments = &moments;
  return s;
}

struct Variant {
  std::string params;
  int sinks, future, keep;
  bool covariance, vnorm;
};

TEST(ExpectedAttentionPolicy, KeepsWhatTheDefinitionScoresHighest) {
  // 6 query heads over 2 KV heads (groups of 3), head dim 16, 120 prompt entries.
  const Layer layer(6, 2, 16, 120, 7);
  const HostKeys keys(layer);
  for (const Variant& v : {Variant{"budget=40", 4, 512, 36, true, true},
                           Variant{"budget=30,sinks=2,future=64", 2, 64, 28, true, true},
                           Variant{"budget=40,covariance=false", 4, 512, 36, false, true},
                           Variant{"budget=40,vnorm=false", 4, 512, 36, true, false}}) {
    const QueryMoments moments = layer.moments(v.sinks);
    auto policy = expected_attention(v.params, 6, 2);
    EXPECT_EQ(policy->needs(test::start(layer.n)).query_moments_from, v.sinks) << v.params;
    const std::optional<Selection> sel = policy->on_prefill_end(end_state(layer, moments, keys));
    ASSERT_TRUE(sel.has_value()) << v.params;
    ASSERT_EQ(sel->kept.size(), 2u) << "one list per KV head";
    const auto scores = reference_scores(layer, v.sinks, layer.n, v.future, v.covariance, v.vnorm);
    for (int g = 0; g < 2; ++g) EXPECT_EQ(sel->kept[g], reference_kept(scores[g], v.sinks, v.keep)) << v.params << " KV head " << g;
  }
}

TEST(ExpectedAttentionPolicy, APromptWithinTheBudgetKeepsEverything) {
  const Layer layer(2, 1, 8, 40, 3);
  const HostKeys keys(layer);
  const QueryMoments moments = layer.moments(4);
  EXPECT_FALSE(expected_attention("budget=40", 2, 1)->on_prefill_end(end_state(layer, moments, keys)).has_value());
  EXPECT_TRUE(expected_attention("budget=39", 2, 1)->on_prefill_end(end_state(layer, moments, keys)).has_value());
}

TEST(ExpectedAttentionPolicy, AFractionResolvesAgainstTheCompressionPoint) {
  // 25% of a 120-token prompt keeps 30 entries at its end; at a chunk point of 80 (chunked prefill) it keeps 20,
  // whatever the prompt's full length: the decision depends on the prefix alone.
  const Layer layer(2, 1, 8, 120, 5);
  const HostKeys keys(layer);
  const QueryMoments moments = layer.moments(4);
  const std::optional<Selection> end = expected_attention("budget=0.25", 2, 1)->on_prefill_end(end_state(layer, moments, keys));
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(end->kept[0].size(), 30u);
  LayerState chunk = end_state(layer, moments, keys);
  chunk.prompt_len = 400;
  chunk.compression_point = 80;
  const std::optional<Selection> at_point = expected_attention("budget=0.25", 2, 1, true)->on_prefill_chunk(chunk);
  ASSERT_TRUE(at_point.has_value());
  EXPECT_EQ(at_point->kept[0].size(), 20u);
  EXPECT_EQ(expected_attention("budget=0.25", 2, 1)->prefill_budget(400), 100) << "the most any point keeps";
}

TEST(ExpectedAttentionPolicy, ChunkedPrefillLeavesThePromptsTailWhole) {
  const Layer layer(2, 1, 8, 120, 9);
  const HostKeys keys(layer);
  const QueryMoments moments = layer.moments(4);
  auto chunked = expected_attention("budget=32", 2, 1, true);
  EXPECT_TRUE(chunked->traits().compresses_prefill_chunks);
  EXPECT_TRUE(chunked->traits().reads_key_forms);
  EXPECT_FALSE(chunked->on_prefill_end(end_state(layer, moments, keys)).has_value());
  LayerState point = end_state(layer, moments, keys);
  point.compression_point = 120;
  point.prompt_len = 150;
  const std::optional<Selection> sel = chunked->on_prefill_chunk(point);
  ASSERT_TRUE(sel.has_value());
  // A chunk point scores like the prompt's end of end mode.
  const std::optional<Selection> end = expected_attention("budget=32", 2, 1)->on_prefill_end(end_state(layer, moments, keys));
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(sel->kept, end->kept);
  EXPECT_FALSE(chunked->on_decode_step(test::at(150, 60, 1, {}, &keys)).has_value()) << "nothing while decoding";
}

TEST(ExpectedAttentionPolicy, EntriesAfterAChunkedPointFollowEveryCompressionBeforeIt) {
  // Chunks of 40 (the helper's chunked context): each point keeps min(the previous point's entries + 40, budget).
  EXPECT_EQ(expected_attention("budget=0.25", 2, 1, true)->entries_after_point(120), 30);
  EXPECT_EQ(expected_attention("budget=32", 2, 1, true)->entries_after_point(80), 32);
  // 90% grows faster than a chunk's worth is cut: 36, then min(76, 72), then min(112, 108).
  EXPECT_EQ(expected_attention("budget=0.9", 2, 1, true)->entries_after_point(120), 108);
  // 99% (a budget rounds up): every entry at 40 and at 80, then min(120, 119).
  auto near_one = expected_attention("budget=0.99", 2, 1, true);
  EXPECT_EQ(near_one->entries_after_point(120), 119);
  EXPECT_FALSE(near_one->entries_after_point(100).has_value()) << "not a compression point";
  EXPECT_FALSE(expected_attention("budget=32", 2, 1)->entries_after_point(120).has_value()) << "end mode";
}

TEST(ExpectedAttentionPolicy, BadParametersNameTheKey) {
  for (const auto& [params, key] : std::vector<std::pair<std::string, std::string>>{
           {"budget=4", "budget"}, {"budget=4,sinks=4", "budget"}, {"future=0", "future"},
           {"covariance=maybe", "covariance"}, {"window=8", "window"}}) {
    try {
      expected_attention(params, 1, 1);
      ADD_FAILURE() << params << " was accepted";
    } catch (const PolicyError& e) {
      EXPECT_EQ(e.param(), key) << params << ": " << e.what();
    }
  }
}

}  // namespace
}  // namespace strata
