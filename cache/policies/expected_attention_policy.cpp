// `expected_attention`: each KV head keeps the entries that the queries still to come are expected to attend to
// most, estimated from the prompt's own queries without knowing the question (Devoto et al., 2025, "Expected
// Attention"; NVIDIA kvpress's ExpectedAttentionPress). So its decision depends on the prefix alone, and a
// compressed document serves any question ([shared-compressed], docs/decisions.md).
//
// At a compression point P (the prompt's end, or with chunked prefill the end of each chunk), per query head h:
//   mu, Sigma   the mean and covariance (divided by the row count) of the layer's queries before RoPE over the
//               prompt rows [sinks, P) (cache/query_moments.h);
//   Rbar        the RoPE rotation averaged over the next `future` positions [P, P + future): per pair of
//               dimensions rotated by frequency theta_i, mean cos(p theta_i) and mean sin(p theta_i);
//   z(e)        mubar . k_e / sqrt(d) + k_e^T Sigmabar k_e / (2 d), with mubar = Rbar mu and Sigmabar = Rbar Sigma
//               Rbar^T: log E[exp(q . k_e / sqrt(d))] for q Gaussian (the second term only with covariance=true);
//   p(e)        the softmax of z over the entries after the sinks.
// A KV head scores entry e by the mean of p(e) over its query heads, times |v_e| (vnorm=true), and keeps the sinks
// and the top C - sinks of the rest (ties: higher score, then lower index). Nothing is evicted while decoding.
// Keys and values are read through LayerKeys::key_forms, where the cache lives (quantized groups dequantized).
//
// Every decision is a function of the prefix before its compression point alone, which is what lets a compressed
// document serve any question: a budget given as a fraction resolves against the compression point (the prefix
// so far), and with chunked prefill the prompt's end is not a compression point: the tokens after the last
// multiple of kv_cache.prefill_chunk (the end of a document and the question after it) stay whole, at most one
// chunk, as a question asked after compression would. In end mode the prompt's end is the only point.
//
// Parameters:
//   budget      C, sinks included (default 128); a token count or a fraction of the prefix at the compression point.
//   sinks       default 4: the first entries, always kept and left out of the statistics (kvpress's n_sink).
//   future      default 512: the future positions the rotation is averaged over (kvpress's n_future_positions).
//   covariance  true (default) | false; vnorm true (default) | false: kvpress's use_covariance, use_vnorm.
// A prompt of n <= C keeps everything.
#include <algorithm>
#include <cmath>
#include <vector>

#include "cache/policies/policies.h"
#include "cache/policies/selection.h"
#include "kernels/cpu/cpu_ops.h"

namespace strata {
namespace {

// The RoPE rotation averaged over positions [first, first + count): per rotated pair i of dimensions (a_i, b_i),
// c_i = mean cos(p theta_i) and s_i = mean sin(p theta_i). Angles as the model computes them (fp32 product).
struct AveragedRotation {
  std::vector<int> a, b;
  std::vector<double> c, s;

  AveragedRotation(const RopeParams& rope, int head_dim, int first, int count) {
    const int half = head_dim / 2;
    std::vector<float> inv_freq(static_cast<size_t>(half));
    cpu::rope_inv_freq(head_dim, rope, inv_freq.data());
    for (int i = 0; i < half; ++i) {
      a.push_back(rope.style == RopeStyle::interleaved ? 2 * i : i);
      b.push_back(rope.style == RopeStyle::interleaved ? 2 * i + 1 : i + half);
      double sum_c = 0.0, sum_s = 0.0;
      for (int p = first; p < first + count; ++p) {
        const float angle = float(p) * inv_freq[size_t(i)];
        sum_c += std::cos(double(angle));
        sum_s += std::sin(double(angle));
      }
      c.push_back(sum_c / count);
      s.push_back(sum_s / count);
    }
  }

  // x := Rbar x for a vector; each pair (x_a, x_b) -> (c x_a - s x_b, s x_a + c x_b).
  void rotate(double* x, int stride) const {
    for (size_t i = 0; i < a.size(); ++i) {
      const double xa = x[int64_t(a[i]) * stride], xb = x[int64_t(b[i]) * stride];
      x[int64_t(a[i]) * stride] = c[i] * xa - s[i] * xb;
      x[int64_t(b[i]) * stride] = s[i] * xa + c[i] * xb;
    }
  }
  // M := Rbar M Rbar^T for a [d][d] row-major matrix: every column, then every row (Rbar has two entries a row).
  void conjugate(std::vector<double>& m, int d) const {
    for (int col = 0; col < d; ++col) rotate(m.data() + col, d);
    for (int row = 0; row < d; ++row) rotate(m.data() + int64_t(row) * d, 1);
  }
};

class ExpectedAttentionPolicy final : public CompressionPolicy {
 public:
  ExpectedAttentionPolicy(Budget budget, int sinks, int future, bool covariance, bool vnorm,
                          const PolicyContext& context)
      : budget_(budget), sinks_(sinks), future_(future), covariance_(covariance), vnorm_(vnorm), context_(context) {}

  std::string_view name() const override { return "expected_attention"; }
  PolicyTraits traits() const override {
    PolicyTraits t;
    t.compresses_prefill_chunks = true;
    t.reads_key_forms = true;
    return t;
  }
  PolicyNeeds needs(const LayerState&) const override {
    PolicyNeeds n;
    n.query_moments_from = sinks_;
    return n;
  }
  std::optional<Selection> on_prefill_end(const LayerState& state) override {
    if (context_.prefill_chunk > 0) return std::nullopt;
    return select(state);
  }
  // Chunked prefill: the same selection with the rows so far, future positions from the chunk's end.
  std::optional<Selection> on_prefill_chunk(const LayerState& state) override { return select(state); }
  std::optional<Selection> on_decode_step(const LayerState&) override { return std::nullopt; }
  // The largest budget of any point: the prompt's own (a fraction grows with the point).
  std::optional<int> prefill_budget(int prompt_len) const override { return budget_at(prompt_len); }
  // The chunked prefill from position 0 to `point`: each compression keeps min(held, budget) of the entries held,
  // the previous point's and a chunk.
  std::optional<int> entries_after_point(int point) const override {
    return entries_after_chunked_points(point, context_.prefill_chunk, [this](int p) { return budget_at(p); });
  }

 private:
  std::optional<Selection> select(const LayerState& state) const {
    const int n = state.n_entries;
    const int budget = budget_at(state.point());
    if (n <= budget) return std::nullopt;
    if (!state.query_moments || state.query_moments->rows() == 0 || !state.keys) {
      throw std::logic_error("expected_attention: no query moments or keys at a compression point");
    }
    const std::vector<std::vector<float>> scores = kv_head_scores(state);
    Selection keep;
    for (const std::vector<float>& head : scores) {
      std::vector<int32_t> kept;
      for (int j = 0; j < sinks_; ++j) kept.push_back(j);
      for (int32_t e : top_k(head, budget - sinks_)) kept.push_back(sinks_ + e);
      keep.kept.push_back(std::move(kept));
    }
    return keep;
  }

  // The entries kept at a compression point: C, or the sinks alone when a fraction falls below them.
  int budget_at(int point) const { return std::max(budget_.resolve(point), sinks_); }

  // [n_kv_heads][n - sinks]: each KV head's score of the entries after the sinks.
  std::vector<std::vector<float>> kv_head_scores(const LayerState& state) const {
    const QueryMoments& moments = *state.query_moments;
    const int d = moments.head_dim(), n = state.n_entries, group = context_.n_heads / context_.n_kv_heads;
    const AveragedRotation rotation(context_.rope, d, state.point(), future_);
    std::vector<std::vector<float>> scores;
    for (int g = 0; g < context_.n_kv_heads; ++g) {
      std::vector<float> linear, quadratic;
      for (int h = g * group; h < (g + 1) * group; ++h) append_forms(moments, h, rotation, linear, quadratic);
      std::vector<float> forms(static_cast<size_t>(group) * size_t(n)), value_norms(static_cast<size_t>(n));
      state.keys->key_forms(g, linear, quadratic, forms, value_norms);
      std::vector<double> mean_probability(size_t(n - sinks_), 0.0);
      for (int j = 0; j < group; ++j) add_softmax(forms.data() + int64_t(j) * n + sinks_, mean_probability);
      std::vector<float> head(mean_probability.size());
      for (size_t e = 0; e < head.size(); ++e) {
        head[e] = float(mean_probability[e] / group * (vnorm_ ? value_norms[e + size_t(sinks_)] : 1.0f));
      }
      scores.push_back(std::move(head));
    }
    return scores;
  }

  // Query head h's form: linear = mubar / sqrt(d), quadratic = Sigmabar / (2 d) (zero without covariance).
  void append_forms(const QueryMoments& moments, int h, const AveragedRotation& rotation, std::vector<float>& linear,
                    std::vector<float>& quadratic) const {
    const int d = moments.head_dim();
    std::vector<double> mu = moments.mean(h);
    rotation.rotate(mu.data(), 1);
    for (double x : mu) linear.push_back(float(x / std::sqrt(double(d))));
    std::vector<double> sigma = covariance_ ? moments.covariance(h) : std::vector<double>(size_t(d) * d, 0.0);
    rotation.conjugate(sigma, d);
    for (double x : sigma) quadratic.push_back(float(x / (2.0 * d)));
  }

  // out[e] += softmax(z)[e] over z[0 .. out.size()).
  static void add_softmax(const float* z, std::vector<double>& out) {
    const double top = *std::max_element(z, z + out.size());
    double total = 0.0;
    for (size_t e = 0; e < out.size(); ++e) total += std::exp(double(z[e]) - top);
    for (size_t e = 0; e < out.size(); ++e) out[e] += std::exp(double(z[e]) - top) / total;
  }

  Budget budget_;
  int sinks_;
  int future_;
  bool covariance_;
  bool vnorm_;
  PolicyContext context_;
};

}  // namespace

std::unique_ptr<CompressionPolicy> make_expected_attention_policy(const PolicySpec& spec,
                                                                  const PolicyContext& context) {
  ParamReader reader(spec);
  const Budget budget = reader.get_budget("budget", Budget{128});
  const int sinks = reader.get_int("sinks", 4, 0, 1 << 20);
  const int future = reader.get_int("future", 512, 1, 1 << 20);
  const bool covariance = reader.get_bool("covariance", true);
  const bool vnorm = reader.get_bool("vnorm", true);
  reader.finish();
  if (budget.fraction == 0.0 && budget.tokens <= sinks) {
    throw PolicyError("budget", spec.name + ": budget: must exceed sinks (" + std::to_string(sinks) + "), got " +
                                    std::to_string(budget.tokens));
  }
  return std::make_unique<ExpectedAttentionPolicy>(budget, sinks, future, covariance, vnorm, context);
}

}  // namespace strata
