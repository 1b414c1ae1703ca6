// The CPU reference ops (kernels/cpu/) through the Backend interface, each against a naive double-precision
// reference written here. Inputs are random with fixed seeds; sizes stay small so the suite runs in a few seconds.
#include "kernels/backend.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/kv_block_layout.h"
#include "kernels/tensor.h"

namespace strata {
namespace {

std::vector<float> random_values(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// A backend tensor holding a copy of host data.
Tensor to_device(Backend& be, const std::vector<float>& host, int64_t rows, int64_t cols) {
  EXPECT_EQ(size_t(rows * cols), host.size());
  Tensor t = be.alloc(rows, cols, DType::f32);
  be.copy_from_host(host.data(), t);
  return t;
}

std::vector<float> to_host(Backend& be, const Tensor& t) {
  std::vector<float> host(size_t(t.size()));
  be.copy_to_host(t, host.data());
  return host;
}

// ---------------------------------------------------------------------------------------------------------------
// matmul

struct MatmulShape {
  int64_t rows, n_in, n_out;
};

void check_matmul(Backend& be, const MatmulShape& s, uint32_t seed) {
  const std::vector<float> x = random_values(size_t(s.rows * s.n_in), seed);
  const std::vector<float> w = random_values(size_t(s.n_out * s.n_in), seed + 1);
  Tensor tx = to_device(be, x, s.rows, s.n_in);
  Tensor tw = be.upload_weight(WeightMatrix{w.data(), WeightFormat::f32, s.n_out, s.n_in});
  Tensor to = be.alloc(s.rows, s.n_out, DType::f32);
  be.matmul(tx, tw, to);
  const std::vector<float> out = to_host(be, to);
  for (int64_t r = 0; r < s.rows; ++r) {
    for (int64_t o = 0; o < s.n_out; ++o) {
      double ref = 0.0, mag = 0.0;
      for (int64_t i = 0; i < s.n_in; ++i) {
        const double p = double(x[size_t(r * s.n_in + i)]) * double(w[size_t(o * s.n_in + i)]);
        ref += p;
        mag += std::abs(p);
      }
      ASSERT_NEAR(out[size_t(r * s.n_out + o)], ref, 1e-6 * mag + 1e-6)
          << s.rows << "x" << s.n_in << "x" << s.n_out << " at row " << r << " col " << o;
    }
  }
  be.free(tx);
  be.free(to);
}

TEST(CpuMatmul, MatchesDoubleReferenceForSmallAndOddShapes) {
  auto be = make_cpu_backend();
  const std::vector<MatmulShape> shapes = {
      {1, 576, 1536},  // one decode token through an MLP projection
      {7, 100, 33},    // odd everything
      {1, 1, 1},
      {3, 17, 1},      // one output column
      {2, 5, 65},      // just past the 64-column slice
      {5, 64, 130},
      {33, 576, 192},  // a prefill chunk through the K projection of SmolLM2
      {4, 31, 1537},   // many column slices, the last one short
  };
  uint32_t seed = 1;
  for (const MatmulShape& s : shapes) check_matmul(*be, s, seed += 10);
}

TEST(CpuMatmul, SameResultWhateverTheThreadCount) {
  // The output columns are split across the compute threads; every split must give the same numbers as the
  // reference.
  auto be = make_cpu_backend();
  const int saved = cpu::compute_pool().size();
  for (int threads : {1, 2, 3, 4, 7}) {
    cpu::set_compute_threads(threads);
    check_matmul(*be, {3, 48, 1000}, 77);
    check_matmul(*be, {1, 9, 70}, 78);
  }
  cpu::set_compute_threads(saved);
}

TEST(CpuMatmul, OutputWithSpareRowsKeepsThemAndMismatchedShapesThrow) {
  auto be = make_cpu_backend();
  const std::vector<float> x = random_values(2 * 8, 5), w = random_values(3 * 8, 6);
  Tensor tx = to_device(*be, x, 2, 8);
  Tensor tw = be->upload_weight(WeightMatrix{w.data(), WeightFormat::f32, 3, 8});
  // A scratch buffer with more rows than the step uses: rows past x.rows are left alone.
  Tensor big = to_device(*be, std::vector<float>(5 * 3, 42.0f), 5, 3);
  be->matmul(tx, tw, big);
  const std::vector<float> out = to_host(*be, big);
  for (int64_t i = 2 * 3; i < 5 * 3; ++i) EXPECT_EQ(out[size_t(i)], 42.0f) << i;
  EXPECT_NE(out[0], 42.0f);

  Tensor wrong_in = be->upload_weight(WeightMatrix{w.data(), WeightFormat::f32, 4, 6});  // in = 6, x has 8
  EXPECT_THROW(be->matmul(tx, wrong_in, big), std::invalid_argument);
  Tensor wrong_out = be->alloc(2, 4, DType::f32);  // out cols 4, w has 3 rows
  EXPECT_THROW(be->matmul(tx, tw, wrong_out), std::invalid_argument);
  Tensor too_few_rows = be->alloc(1, 3, DType::f32);
  EXPECT_THROW(be->matmul(tx, tw, too_few_rows), std::invalid_argument);
}

// ---------------------------------------------------------------------------------------------------------------
// rmsnorm, silu_mul, add, embedding

TEST(CpuRmsnorm, MatchesDoubleReference) {
  auto be = make_cpu_backend();
  const float eps = 1e-5f;
  for (const auto& [rows, d] : std::vector<std::pair<int64_t, int64_t>>{{1, 576}, {5, 33}, {13, 576}, {2, 1}}) {
    std::vector<float> x = random_values(size_t(rows * d), uint32_t(rows * 1000 + d), -3.0f, 3.0f);
    if (rows == 5) {
      for (int64_t i = 0; i < d; ++i) x[size_t(2 * d + i)] *= 1e-3f;  // one row of tiny activations: eps matters
    }
    const std::vector<float> w = random_values(size_t(d), 99, 0.5f, 1.5f);
    Tensor tx = to_device(*be, x, rows, d);
    Tensor tw = to_device(*be, w, 1, d);
    Tensor to = be->alloc(rows, d, DType::f32);
    be->rmsnorm(tx, tw, eps, to);
    const std::vector<float> out = to_host(*be, to);
    for (int64_t r = 0; r < rows; ++r) {
      double ss = 0.0;
      for (int64_t i = 0; i < d; ++i) ss += double(x[size_t(r * d + i)]) * x[size_t(r * d + i)];
      const double inv = 1.0 / std::sqrt(ss / double(d) + eps);
      for (int64_t i = 0; i < d; ++i) {
        const double ref = double(x[size_t(r * d + i)]) * inv * w[size_t(i)];
        ASSERT_NEAR(out[size_t(r * d + i)], ref, 2e-6 * std::abs(ref) + 1e-7) << rows << "x" << d << " r" << r;
      }
    }
  }
}

TEST(CpuRmsnorm, InPlaceGivesTheSameResult) {
  auto be = make_cpu_backend();
  const std::vector<float> x = random_values(4 * 40, 3), w = random_values(40, 4);
  Tensor a = to_device(*be, x, 4, 40), b = to_device(*be, x, 4, 40), tw = to_device(*be, w, 1, 40);
  Tensor out = be->alloc(4, 40, DType::f32);
  be->rmsnorm(a, tw, 1e-6f, out);
  be->rmsnorm(b, tw, 1e-6f, b);
  EXPECT_EQ(to_host(*be, out), to_host(*be, b));
}

TEST(CpuSiluMul, MatchesDoubleReference) {
  auto be = make_cpu_backend();
  // 7 x 1536 (one chunk of an MLP) and a size past the threshold where the loop goes parallel.
  for (const auto& [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{7, 1536}, {1, 70001}, {1, 1}}) {
    const std::vector<float> gate = random_values(size_t(rows * cols), 11, -20.0f, 20.0f);
    const std::vector<float> up = random_values(size_t(rows * cols), 12, -2.0f, 2.0f);
    Tensor tg = to_device(*be, gate, rows, cols), tu = to_device(*be, up, rows, cols);
    Tensor to = be->alloc(rows, cols, DType::f32);
    be->silu_mul(tg, tu, to);
    const std::vector<float> out = to_host(*be, to);
    for (size_t i = 0; i < out.size(); ++i) {
      const double g = gate[i];
      const double ref = g / (1.0 + std::exp(-g)) * double(up[i]);
      ASSERT_NEAR(out[i], ref, 1e-6 * std::abs(ref) + 1e-7) << i << " gate " << g;
    }
  }
}

TEST(CpuSiluMul, ExtremeGatesStayFinite) {
  auto be = make_cpu_backend();
  const std::vector<float> gate = {-1000.0f, -100.0f, -88.0f, -0.0f, 0.0f, 88.0f, 100.0f, 1000.0f};
  const std::vector<float> up(gate.size(), 1.0f);
  Tensor tg = to_device(*be, gate, 1, int64_t(gate.size())), tu = to_device(*be, up, 1, int64_t(gate.size()));
  Tensor to = be->alloc(1, int64_t(gate.size()), DType::f32);
  be->silu_mul(tg, tu, to);
  const std::vector<float> out = to_host(*be, to);
  for (size_t i = 0; i < out.size(); ++i) {
    ASSERT_TRUE(std::isfinite(out[i])) << "gate " << gate[i];
    const double g = gate[i];
    EXPECT_NEAR(out[i], g / (1.0 + std::exp(-g)), 1e-6 * std::abs(g) + 1e-6) << "gate " << g;
  }
}

TEST(CpuAdd, AddsElementwiseInPlace) {
  auto be = make_cpu_backend();
  const std::vector<float> x = random_values(3 * 577, 21), y = random_values(3 * 577, 22);
  Tensor tx = to_device(*be, x, 3, 577), ty = to_device(*be, y, 3, 577);
  be->add(tx, ty);
  const std::vector<float> out = to_host(*be, tx);
  for (size_t i = 0; i < out.size(); ++i) ASSERT_FLOAT_EQ(out[i], x[i] + y[i]) << i;
  EXPECT_EQ(to_host(*be, ty), y);  // y is untouched
}

// Greedy rows (temperature 0): the largest value at the start, the end, in the middle, repeated (the lowest
// column wins), among negative values only, next to -inf, and one made the largest by a negative penalty, which
// sample_rows applies to the row in place.
TEST(CpuSampleRows, GreedyRowsTakeTheLowestColumnOfTheLargestValue) {
  auto be = make_cpu_backend();
  const int64_t cols = 1031;
  std::vector<float> x = random_values(size_t(7 * cols), 41, -3.0f, 3.0f);
  const auto at = [&](int64_t r, int64_t c) -> float& { return x[size_t(r * cols + c)]; };
  at(0, 0) = 9.0f;
  at(1, cols - 1) = 9.0f;
  at(2, 517) = 9.0f;
  at(3, 700) = 9.0f, at(3, 12) = 9.0f, at(3, 900) = 9.0f;
  for (int64_t c = 0; c < cols; ++c) at(4, c) = -10.0f - float(c % 7);
  at(4, 333) = -9.5f;
  at(5, 5) = -INFINITY, at(5, 6) = 9.0f;
  at(6, 40) = 9.0f;
  const std::vector<TokenPenalty> boost = {{41, -7.0f}};  // 41 ends above 9
  std::vector<RowSampling> rows(7);
  rows[6].penalties = boost;
  Tensor t = to_device(*be, x, 7, cols);
  std::vector<RowSample> out(7);
  be->sample_rows(t, rows, out);
  std::vector<int32_t> ids;
  for (const RowSample& s : out) ids.push_back(s.id);
  EXPECT_EQ(ids, (std::vector<int32_t>{0, int32_t(cols - 1), 517, 12, 333, 6, 41}));
  EXPECT_FLOAT_EQ(to_host(*be, t)[size_t(6 * cols + 41)], x[size_t(6 * cols + 41)] + 7.0f);
  std::vector<RowSample> too_few(6);
  EXPECT_THROW(be->sample_rows(t, rows, too_few), std::invalid_argument);
  const std::vector<TokenPenalty> outside = {{int32_t(cols), 1.0f}};
  rows[6].penalties = outside;
  EXPECT_THROW(be->sample_rows(t, rows, out), std::invalid_argument);
  const std::vector<TokenPenalty> twice = {{5, 1.0f}, {9, 1.0f}, {5, 0.5f}};
  rows[6].penalties = twice;
  EXPECT_THROW(be->sample_rows(t, rows, out), std::invalid_argument);
}

// The draw of kernels/token_sampling.h by hand: weights 0.1, 0.2, 0.3, 0.4 (log-probabilities at temperature 1)
// walked in id order, so the uniform number u picks the token whose cumulative interval (0.1, 0.3, 0.6, 1.0) holds
// it; filters shrink the kept set first and the walk covers only it, still in id order.
TEST(CpuSampleRows, TheDrawWalksTheKeptTokensInIdOrder) {
  auto be = make_cpu_backend();
  const std::vector<float> row = {std::log(0.1f), std::log(0.2f), std::log(0.3f), std::log(0.4f)};
  const auto draw = [&](RowSampling s) {
    Tensor t = to_device(*be, row, 1, 4);
    std::vector<RowSample> out(1);
    be->sample_rows(t, {&s, 1}, out);
    return out[0].id;
  };
  RowSampling s;
  s.temperature = 1.0f;
  const std::vector<std::pair<double, int32_t>> all = {{0.0, 0}, {0.05, 0}, {0.15, 1}, {0.29, 1}, {0.31, 2},
                                                       {0.59, 2}, {0.61, 3}, {0.999, 3}};
  for (const auto& [u, id] : all) {
    s.uniform = u;
    EXPECT_EQ(draw(s), id) << "u " << u;
  }
  // top_k 2 keeps tokens 2 and 3 (0.3 and 0.4 of 0.7): token 2 below u = 3/7, token 3 above.
  s.top_k = 2;
  for (const auto& [u, id] : std::vector<std::pair<double, int32_t>>{{0.42, 2}, {0.44, 3}}) {
    s.uniform = u;
    EXPECT_EQ(draw(s), id) << "top_k 2, u " << u;
  }
  // top_p 0.65 needs 0.4 + 0.3 (tokens 3, 2); min_p 0.6 keeps weights >= 0.6 * 0.4 = 0.24 (the same two). Either
  // leaves token 2 below u = 3/7.
  s.top_k = 0;
  s.top_p = 0.65f;
  s.uniform = 0.42;
  EXPECT_EQ(draw(s), 2);
  s.top_p = 1.0f;
  s.min_p = 0.6f;
  EXPECT_EQ(draw(s), 2);
  s.uniform = 0.44;
  EXPECT_EQ(draw(s), 3);
  // A low temperature sharpens the weights: at T = 0.05 token 3 holds 1 - (3/4)^20 ~ 0.997 of the mass after 2.
  s.min_p = 0.0f;
  s.temperature = 0.05f;
  s.uniform = 0.01;
  EXPECT_EQ(draw(s), 3);
}

// At a huge temperature every weight rounds to 1, but the rule's order is still by logit: top_p's two tokens are
// 0 and 2 (logits 0 and -0.5), not 0 and 1 (-1), although tokens 1 and 2 weigh the same.
TEST(CpuSampleRows, TopPCutsByLogitAmongEqualWeights) {
  auto be = make_cpu_backend();
  const std::vector<float> row = {0.0f, -1.0f, -0.5f};
  RowSampling s;
  s.temperature = 1e9f;
  s.top_p = 0.6f;  // 1.8 of the total 3: two tokens
  for (const auto& [u, id] : std::vector<std::pair<double, int32_t>>{{0.25, 0}, {0.75, 2}}) {
    s.uniform = u;
    Tensor t = to_device(*be, row, 1, 3);
    std::vector<RowSample> out(1);
    be->sample_rows(t, {&s, 1}, out);
    EXPECT_EQ(out[0].id, id) << "u " << u;
  }
}

TEST(CpuEmbedding, CopiesTheRowOfEveryId) {
  auto be = make_cpu_backend();
  const int64_t vocab = 50, d = 24;
  const std::vector<float> table = random_values(size_t(vocab * d), 31);
  Tensor tt = be->upload_weight(WeightMatrix{table.data(), WeightFormat::f32, vocab, d});
  const std::vector<int32_t> ids = {0, 49, 7, 7, 0, 23, 49};  // both ends, repeats
  Tensor to = be->alloc(int64_t(ids.size()), d, DType::f32);
  be->embedding(ids, tt, to);
  const std::vector<float> out = to_host(*be, to);
  for (size_t t = 0; t < ids.size(); ++t) {
    for (int64_t i = 0; i < d; ++i) {
      ASSERT_EQ(out[t * size_t(d) + size_t(i)], table[size_t(ids[t] * d + i)]) << "token " << t << " dim " << i;
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// RoPE

// Inverse frequencies computed here from the formulas (model_format.md section 3; Llama 3.1 scaling as in the
// Hugging Face `_compute_llama3_parameters`), in double.
std::vector<double> reference_inv_freq(int head_dim, double theta, const RopeScaling& s) {
  std::vector<double> f(size_t(head_dim / 2));
  for (int i = 0; i < head_dim / 2; ++i) f[size_t(i)] = std::pow(theta, -2.0 * i / head_dim);
  if (s.factor <= 0.0f) return f;
  const double low_wavelen = s.original_context / double(s.low_freq_factor);
  const double high_wavelen = s.original_context / double(s.high_freq_factor);
  for (double& x : f) {
    const double wavelen = 2.0 * M_PI / x;
    if (wavelen < high_wavelen) continue;  // high frequencies: kept
    if (wavelen > low_wavelen) {           // low frequencies: divided by factor
      x /= s.factor;
      continue;
    }
    const double smooth = (s.original_context / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
    x = (1.0 - smooth) * x / s.factor + smooth * x;
  }
  return f;
}

// Half-split RoPE in double (rotate_half): pair (i, i + d/2) turns by pos * inv_freq[i].
std::vector<double> reference_rope_half_split(const std::vector<float>& x, const std::vector<int32_t>& positions,
                                              int n_heads, int d, const std::vector<double>& inv_freq) {
  std::vector<double> y(x.begin(), x.end());
  for (size_t t = 0; t < positions.size(); ++t) {
    for (int h = 0; h < n_heads; ++h) {
      const size_t base = t * size_t(n_heads * d) + size_t(h * d);
      for (int i = 0; i < d / 2; ++i) {
        const double a = positions[t] * inv_freq[size_t(i)];
        const double x0 = x[base + size_t(i)], x1 = x[base + size_t(i + d / 2)];
        y[base + size_t(i)] = x0 * std::cos(a) - x1 * std::sin(a);
        y[base + size_t(i + d / 2)] = x1 * std::cos(a) + x0 * std::sin(a);
      }
    }
  }
  return y;
}

// GGUF_row[h*d + 2i + j] = HF_row[h*d + j*(d/2) + i], applied to every token row.
std::vector<float> hf_to_gguf(const std::vector<float>& hf, int n_tokens, int n_heads, int d) {
  std::vector<float> g(hf.size());
  for (int t = 0; t < n_tokens; ++t) {
    for (int h = 0; h < n_heads; ++h) {
      const size_t base = size_t(t) * size_t(n_heads * d) + size_t(h * d);
      for (int i = 0; i < d / 2; ++i) {
        for (int j = 0; j < 2; ++j) g[base + size_t(2 * i + j)] = hf[base + size_t(j * (d / 2) + i)];
      }
    }
  }
  return g;
}

std::vector<float> apply_rope(Backend& be, const std::vector<float>& x, const std::vector<int32_t>& positions,
                              int n_heads, int d, const RopeParams& p) {
  Tensor t = to_device(be, x, int64_t(positions.size()), int64_t(n_heads) * d);
  be.rope(t, positions, n_heads, d, p);
  std::vector<float> out = to_host(be, t);
  be.free(t);
  return out;
}

RopeParams llama3_params(RopeStyle style) {
  RopeParams p;
  p.style = style;
  p.theta = 500000.0f;
  p.scaling.factor = 8.0f;
  p.scaling.low_freq_factor = 1.0f;
  p.scaling.high_freq_factor = 4.0f;
  p.scaling.original_context = 8192;
  return p;
}

TEST(CpuRope, InterleavedAndHalfSplitAgreeUnderTheRowPermutation) {
  auto be = make_cpu_backend();
  const int n_heads = 3, d = 64;
  const std::vector<int32_t> positions = {1, 2, 7, 100, 1000, 4095, 31};  // > 0: position 0 hides a wrong layout
  const int n = int(positions.size());
  for (bool scaled : {false, true}) {
    RopeParams half, inter;
    if (scaled) {
      half = llama3_params(RopeStyle::half_split);
      inter = llama3_params(RopeStyle::interleaved);
    } else {
      half.style = RopeStyle::half_split;
      inter.style = RopeStyle::interleaved;
      half.theta = inter.theta = 10000.0f;
    }
    const std::vector<float> hf = random_values(size_t(n * n_heads * d), 41);
    const std::vector<float> hf_out = apply_rope(*be, hf, positions, n_heads, d, half);
    const std::vector<float> gguf_out = apply_rope(*be, hf_to_gguf(hf, n, n_heads, d), positions, n_heads, d, inter);
    const std::vector<float> expected = hf_to_gguf(hf_out, n, n_heads, d);
    for (size_t i = 0; i < expected.size(); ++i) {
      ASSERT_NEAR(gguf_out[i], expected[i], 1e-6f) << (scaled ? "scaled " : "") << "element " << i;
    }
    // And the half-split result is the formula of the spec, computed here in double.
    const std::vector<double> ref =
        reference_rope_half_split(hf, positions, n_heads, d, reference_inv_freq(d, half.theta, half.scaling));
    for (size_t i = 0; i < ref.size(); ++i) {
      // fp32 angles at position 4095 carry ~pos * 2^-24 rad of error, as in the transformers reference.
      ASSERT_NEAR(hf_out[i], ref[i], 1e-3) << (scaled ? "scaled " : "") << "element " << i;
    }
    // The rotation did something: a test that passes for the identity would prove nothing.
    double moved = 0.0;
    for (size_t i = 0; i < hf.size(); ++i) moved += std::abs(hf_out[i] - hf[i]);
    EXPECT_GT(moved, 1.0);
  }
}

TEST(CpuRope, PositionZeroIsTheIdentity) {
  auto be = make_cpu_backend();
  const int n_heads = 4, d = 16;
  for (RopeStyle style : {RopeStyle::interleaved, RopeStyle::half_split}) {
    for (bool scaled : {false, true}) {
      RopeParams p = scaled ? llama3_params(style) : RopeParams{};
      p.style = style;
      const std::vector<float> x = random_values(size_t(2 * n_heads * d), 51);
      const std::vector<float> out = apply_rope(*be, x, {0, 0}, n_heads, d, p);
      EXPECT_EQ(out, x);
    }
  }
}

TEST(CpuRope, RotationPreservesTheNormOfEveryPair) {
  auto be = make_cpu_backend();
  const int n_heads = 2, d = 32;
  const std::vector<int32_t> positions = {3, 17, 250, 8191, 20000};
  const std::vector<float> x = random_values(size_t(positions.size()) * n_heads * d, 61, -4.0f, 4.0f);
  for (RopeStyle style : {RopeStyle::interleaved, RopeStyle::half_split}) {
    RopeParams p = llama3_params(style);
    const std::vector<float> y = apply_rope(*be, x, positions, n_heads, d, p);
    for (size_t t = 0; t < positions.size(); ++t) {
      for (int h = 0; h < n_heads; ++h) {
        const size_t base = t * size_t(n_heads * d) + size_t(h * d);
        for (int i = 0; i < d / 2; ++i) {
          const size_t a = base + size_t(style == RopeStyle::interleaved ? 2 * i : i);
          const size_t b = base + size_t(style == RopeStyle::interleaved ? 2 * i + 1 : i + d / 2);
          const double before = double(x[a]) * x[a] + double(x[b]) * x[b];
          const double after = double(y[a]) * y[a] + double(y[b]) * y[b];
          ASSERT_NEAR(after, before, 1e-5 * before + 1e-9) << "token " << t << " head " << h << " pair " << i;
        }
      }
    }
  }
}

TEST(CpuRope, Llama3ScalingInverseFrequenciesCoverAllThreeBands) {
  const int d = 128;
  const RopeParams p = llama3_params(RopeStyle::interleaved);
  std::vector<float> got(d / 2);
  cpu::rope_inv_freq(d, p, got.data());
  const std::vector<double> ref = reference_inv_freq(d, 500000.0, p.scaling);
  int kept = 0, divided = 0, smoothed = 0;
  for (int i = 0; i < d / 2; ++i) {
    const double plain = std::pow(500000.0, -2.0 * i / d);
    const double wavelen = 2.0 * M_PI / plain;
    if (wavelen < 8192.0 / 4.0) {
      ++kept;
      EXPECT_NEAR(ref[size_t(i)], plain, 1e-15);
    } else if (wavelen > 8192.0) {
      ++divided;
      EXPECT_NEAR(ref[size_t(i)], plain / 8.0, 1e-15);
    } else {
      ++smoothed;
      EXPECT_LT(ref[size_t(i)], plain);
      EXPECT_GT(ref[size_t(i)], plain / 8.0);
    }
    EXPECT_NEAR(got[size_t(i)], ref[size_t(i)], 1e-5 * ref[size_t(i)]) << "frequency " << i;
  }
  // Each band holds several frequencies, so each formula above was exercised.
  EXPECT_GE(kept, 3);
  EXPECT_GE(divided, 3);
  EXPECT_GE(smoothed, 3);

  // Without scaling: theta^(-2i/d).
  RopeParams plain_p;
  plain_p.theta = 10000.0f;
  cpu::rope_inv_freq(d, plain_p, got.data());
  for (int i = 0; i < d / 2; ++i) {
    EXPECT_NEAR(got[size_t(i)], std::pow(10000.0, -2.0 * i / d), 1e-6 * std::pow(10000.0, -2.0 * i / d)) << i;
  }
}

TEST(CpuRope, ScaledRotationUsesTheScaledFrequencies) {
  // The rotation angle of pair i at position p is p * inv_freq[i] with the Llama 3 frequencies: read it back.
  auto be = make_cpu_backend();
  const int d = 128;
  const RopeParams p = llama3_params(RopeStyle::half_split);
  const std::vector<double> ref = reference_inv_freq(d, 500000.0, p.scaling);
  std::vector<float> x(size_t(d), 0.0f);
  for (int i = 0; i < d / 2; ++i) x[size_t(i)] = 1.0f;  // every pair starts at angle 0
  const int32_t pos = 3;
  const std::vector<float> y = apply_rope(*be, x, {pos}, 1, d, p);
  for (int i = 0; i < d / 2; ++i) {
    const double angle = std::atan2(y[size_t(i + d / 2)], y[size_t(i)]);
    const double expected = std::remainder(pos * ref[size_t(i)], 2.0 * M_PI);
    EXPECT_NEAR(angle, expected, 1e-5) << "pair " << i;
  }
}

// ---------------------------------------------------------------------------------------------------------------
// The paged KV cache: kv_write, paged_attention, kv_compact.
//
// The block layout is the documented one (kernels/kv_block_layout.h), spelled out again here:
//   K: [n_kv_heads][block_size][head_dim]  then  V: [n_kv_heads][block_size][head_dim]

struct Pool {
  Backend& be;
  Tensor storage;
  KvPoolView view;
  Pool(Backend& backend, KvBlockLayout layout, int n_blocks) : be(backend) {
    storage = be.alloc(n_blocks, 2LL * layout.n_kv_heads * layout.block_size * layout.head_dim, DType::f32);
    view = KvPoolView{storage.data, layout, 0, {}};
  }
  ~Pool() { be.free(storage); }
  float* k(int32_t block, int head, int slot) const {
    const KvBlockLayout& L = view.layout;
    return static_cast<float*>(storage.data) + int64_t(block) * 2 * L.n_kv_heads * L.block_size * L.head_dim +
           (int64_t(head) * L.block_size + slot) * L.head_dim;
  }
  float* v(int32_t block, int head, int slot) const {
    const KvBlockLayout& L = view.layout;
    return k(block, head, slot) + int64_t(L.n_kv_heads) * L.block_size * L.head_dim;
  }
  // Entry e of a block table.
  float* k_entry(const std::vector<int32_t>& table, int e, int head) const {
    return k(table[size_t(e / view.layout.block_size)], head, e % view.layout.block_size);
  }
  float* v_entry(const std::vector<int32_t>& table, int e, int head) const {
    return v(table[size_t(e / view.layout.block_size)], head, e % view.layout.block_size);
  }
  void fill(float value) {
    std::fill(storage.f32(), storage.f32() + storage.size(), value);
  }
};

// Random, non-contiguous block tables over one pool: the pool's blocks shuffled and dealt out.
std::vector<std::vector<int32_t>> deal_blocks(int n_blocks, const std::vector<int>& blocks_per_seq, uint32_t seed) {
  std::vector<int32_t> ids(static_cast<size_t>(n_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(seed));
  std::vector<std::vector<int32_t>> tables;
  size_t next = 0;
  for (int n : blocks_per_seq) {
    tables.emplace_back(ids.begin() + ptrdiff_t(next), ids.begin() + ptrdiff_t(next + size_t(n)));
    next += size_t(n);
  }
  return tables;
}

struct SeqSpec {
  int n_ctx_before;
  int n_q;
};

// One attention problem: per sequence, contiguous K/V for every entry it sees ([n_ctx_before + n_q, Hkv * Dh]),
// queries for its new tokens, and the paged copy of K/V in a pool.
struct AttentionCase {
  int n_heads, n_kv_heads, head_dim, block_size;
  std::vector<SeqSpec> specs;
  std::vector<std::vector<float>> k, v;  // per sequence, contiguous
  std::vector<float> q;                  // [T, H * Dh]
  std::vector<int> q_begin;
  std::vector<std::vector<int32_t>> tables;
  int n_blocks = 0;
  int n_tokens = 0;
};

AttentionCase make_case(int n_heads, int n_kv_heads, int head_dim, int block_size, std::vector<SeqSpec> specs,
                        uint32_t seed, float q_scale = 1.0f) {
  AttentionCase c{n_heads, n_kv_heads, head_dim, block_size, std::move(specs), {}, {}, {}, {}, {}, 0, 0};
  std::vector<int> blocks_per_seq;
  for (const SeqSpec& s : c.specs) {
    const int entries = s.n_ctx_before + s.n_q;
    blocks_per_seq.push_back((entries + block_size - 1) / block_size + 1);  // one spare block at the end
    c.k.push_back(random_values(size_t(entries * n_kv_heads * head_dim), seed++));
    c.v.push_back(random_values(size_t(entries * n_kv_heads * head_dim), seed++));
    c.n_tokens += s.n_q;
  }
  // Query rows of the sequences in reverse order: q_begin need not follow the order of `seqs`.
  int row = c.n_tokens;
  for (const SeqSpec& s : c.specs) {
    row -= s.n_q;
    c.q_begin.push_back(row);
  }
  c.q = random_values(size_t(c.n_tokens * n_heads * head_dim), seed++, -q_scale, q_scale);
  for (int b : blocks_per_seq) c.n_blocks += b;
  c.n_blocks += 3;  // blocks nobody uses
  c.tables = deal_blocks(c.n_blocks, blocks_per_seq, seed);
  return c;
}

std::vector<AttentionSequence> sequences_of(const AttentionCase& c) {
  std::vector<AttentionSequence> seqs;
  for (size_t s = 0; s < c.specs.size(); ++s) {
    seqs.push_back({c.q_begin[s], c.specs[s].n_q, c.specs[s].n_ctx_before, c.tables[s]});
  }
  return seqs;
}

// Naive causal softmax attention over the contiguous K/V, in double.
std::vector<double> reference_attention(const AttentionCase& c, double scale) {
  const int hd = c.head_dim, group = c.n_heads / c.n_kv_heads;
  std::vector<double> out(c.q.size(), 0.0);
  for (size_t s = 0; s < c.specs.size(); ++s) {
    for (int i = 0; i < c.specs[s].n_q; ++i) {
      const int t = c.q_begin[s] + i;
      const int n_keys = c.specs[s].n_ctx_before + i + 1;
      for (int h = 0; h < c.n_heads; ++h) {
        const int kvh = h / group;
        const float* qv = &c.q[size_t(t * c.n_heads * hd + h * hd)];
        std::vector<double> sc(static_cast<size_t>(n_keys));
        double mx = -INFINITY;
        for (int e = 0; e < n_keys; ++e) {
          const float* kv = &c.k[s][size_t((e * c.n_kv_heads + kvh) * hd)];
          double dot = 0.0;
          for (int d = 0; d < hd; ++d) dot += double(qv[d]) * kv[d];
          sc[size_t(e)] = dot * scale;
          mx = std::max(mx, sc[size_t(e)]);
        }
        double sum = 0.0;
        for (double& x : sc) sum += (x = std::exp(x - mx));
        for (int e = 0; e < n_keys; ++e) {
          const float* vv = &c.v[s][size_t((e * c.n_kv_heads + kvh) * hd)];
          for (int d = 0; d < hd; ++d) out[size_t(t * c.n_heads * hd + h * hd + d)] += sc[size_t(e)] / sum * vv[d];
        }
      }
    }
  }
  return out;
}

KvBlockLayout layout_of(const AttentionCase& c) {
  KvBlockLayout L;
  L.n_kv_heads = c.n_kv_heads;
  L.head_dim = c.head_dim;
  L.block_size = c.block_size;
  L.dtype = DType::f32;
  return L;
}

// Puts every entry of every sequence into the pool directly (not through kv_write).
void fill_pool(const AttentionCase& c, Pool& pool) {
  for (size_t s = 0; s < c.specs.size(); ++s) {
    const int entries = c.specs[s].n_ctx_before + c.specs[s].n_q;
    for (int e = 0; e < entries; ++e) {
      for (int h = 0; h < c.n_kv_heads; ++h) {
        const size_t src = size_t((e * c.n_kv_heads + h) * c.head_dim);
        std::copy_n(&c.k[s][src], c.head_dim, pool.k_entry(c.tables[s], e, h));
        std::copy_n(&c.v[s][src], c.head_dim, pool.v_entry(c.tables[s], e, h));
      }
    }
  }
}

void check_attention(const AttentionCase& c, bool through_kv_write) {
  auto be = make_cpu_backend();
  Pool pool(*be, layout_of(c), c.n_blocks);
  pool.fill(std::nanf(""));  // blocks and slots that attention must never read
  const std::vector<AttentionSequence> seqs = sequences_of(c);
  const int64_t q_cols = int64_t(c.n_heads) * c.head_dim, kv_cols = int64_t(c.n_kv_heads) * c.head_dim;
  if (!through_kv_write) {
    fill_pool(c, pool);
  } else {
    // Earlier entries directly; the step's new keys and values through kv_write, as the forward pass does.
    AttentionCase before = c;
    for (SeqSpec& s : before.specs) s = {0, s.n_ctx_before};
    fill_pool(before, pool);
    std::vector<float> k_step(size_t(c.n_tokens * kv_cols)), v_step(k_step.size());
    for (size_t s = 0; s < c.specs.size(); ++s) {
      for (int i = 0; i < c.specs[s].n_q; ++i) {
        const size_t src = size_t((c.specs[s].n_ctx_before + i) * kv_cols);
        const size_t dst = size_t((c.q_begin[s] + i) * kv_cols);
        std::copy_n(&c.k[s][src], kv_cols, &k_step[dst]);
        std::copy_n(&c.v[s][src], kv_cols, &v_step[dst]);
      }
    }
    Tensor tk = to_device(*be, k_step, c.n_tokens, kv_cols), tv = to_device(*be, v_step, c.n_tokens, kv_cols);
    be->kv_write(tk, tv, seqs, pool.view);
  }
  Tensor tq = to_device(*be, c.q, c.n_tokens, q_cols);
  Tensor to = be->alloc(c.n_tokens, q_cols, DType::f32);
  const float scale = 1.0f / std::sqrt(float(c.head_dim));
  be->paged_attention(tq, seqs, pool.view, c.n_heads, scale, to);
  const std::vector<float> out = to_host(*be, to);
  const std::vector<double> ref = reference_attention(c, scale);
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_NEAR(out[i], ref[i], 2e-5) << "block size " << c.block_size << " heads " << c.n_heads << "/"
                                      << c.n_kv_heads << " element " << i << " (token " << i / size_t(q_cols)
                                      << ", head " << (i % size_t(q_cols)) / size_t(c.head_dim) << ")";
  }
}

const std::vector<SeqSpec> kMixedSequences = {
    {0, 7},    // a first prefill chunk
    {13, 4},   // a later prefill chunk after earlier entries
    {30, 1},   // a decode step
    {5, 11},   // a chunk that straddles several blocks
    {16, 1},   // a decode step right at a block boundary for block size 16
};

TEST(CpuPagedAttention, MatchesNaiveCausalAttentionWithGqaAndBlockSizes) {
  for (int block_size : {1, 16, 5}) {
    check_attention(make_case(9, 3, 16, block_size, kMixedSequences, 100 + uint32_t(block_size)), false);
  }
}

TEST(CpuPagedAttention, MultiHeadWithoutGroupingAndSingleKvHead) {
  check_attention(make_case(4, 4, 8, 5, kMixedSequences, 200), false);  // MHA
  check_attention(make_case(6, 1, 12, 16, kMixedSequences, 300), false);  // MQA
}

TEST(CpuPagedAttention, LargeScoresStayStable) {
  // Scores in the hundreds: a softmax without the max subtracted overflows fp32 exp (e^88.7).
  check_attention(make_case(9, 3, 16, 5, kMixedSequences, 400, 400.0f), false);
}

TEST(CpuPagedAttention, AfterKvWriteOfTheStep) {
  for (int block_size : {1, 16, 5}) {
    check_attention(make_case(9, 3, 16, block_size, kMixedSequences, 500 + uint32_t(block_size)), true);
  }
}

TEST(CpuPagedAttention, LongContextDecode) {
  check_attention(make_case(9, 3, 32, 16, {{300, 1}, {77, 3}}, 600), false);
}

// The model's head sizes (64 and 128, and 80 for a remainder past the 64-wide value sums), prefill chunks longer
// than one tile of query rows, and keys past the first transposed chunk of a block.
TEST(CpuPagedAttention, ModelHeadSizesAndLongChunks) {
  const std::vector<SeqSpec> specs = {{0, 40}, {100, 17}, {37, 1}, {250, 2}};
  for (int head_dim : {64, 128, 80}) {
    for (int block_size : {16, 5, 40}) {
      check_attention(make_case(9, 3, head_dim, block_size, specs, 700 + uint32_t(head_dim + block_size)), false);
    }
  }
}

// Column sums: the probabilities of rows >= stats_row_begin, summed per query head and cache entry.
TEST(CpuPagedAttention, ColumnSumsOfTheStatsRows) {
  const AttentionCase c = make_case(6, 2, 64, 5, {{30, 21}, {0, 1}}, 800);
  auto be = make_cpu_backend();
  Pool pool(*be, layout_of(c), c.n_blocks);
  pool.fill(std::nanf(""));
  fill_pool(c, pool);
  std::vector<AttentionSequence> seqs = sequences_of(c);
  const int entries = c.specs[0].n_ctx_before + c.specs[0].n_q, first_stats_row = 13;
  std::vector<float> sums(size_t(c.n_heads * entries), 0.5f);  // sums are added to what is there
  seqs[0].column_sums = sums.data();
  seqs[0].sums_stride = entries;
  seqs[0].stats_row_begin = first_stats_row;
  const int64_t q_cols = int64_t(c.n_heads) * c.head_dim;
  Tensor tq = to_device(*be, c.q, c.n_tokens, q_cols);
  Tensor to = be->alloc(c.n_tokens, q_cols, DType::f32);
  const double scale = 1.0 / std::sqrt(double(c.head_dim));
  be->paged_attention(tq, seqs, pool.view, c.n_heads, float(scale), to);

  const int group = c.n_heads / c.n_kv_heads, hd = c.head_dim;
  for (int h = 0; h < c.n_heads; ++h) {
    std::vector<double> expected(size_t(entries), 0.5);
    for (int i = first_stats_row; i < c.specs[0].n_q; ++i) {
      const int n_keys = c.specs[0].n_ctx_before + i + 1;
      const float* qv = &c.q[size_t((c.q_begin[0] + i) * q_cols + h * hd)];
      std::vector<double> p(static_cast<size_t>(n_keys));
      double mx = -INFINITY, total = 0.0;
      for (int e = 0; e < n_keys; ++e) {
        const float* kv = &c.k[0][size_t((e * c.n_kv_heads + h / group) * hd)];
        double dot = 0.0;
        for (int d = 0; d < hd; ++d) dot += double(qv[d]) * kv[d];
        mx = std::max(mx, p[size_t(e)] = dot * scale);
      }
      for (double& x : p) total += (x = std::exp(x - mx));
      for (int e = 0; e < n_keys; ++e) expected[size_t(e)] += p[size_t(e)] / total;
    }
    for (int e = 0; e < entries; ++e) {
      ASSERT_NEAR(sums[size_t(h * entries + e)], expected[size_t(e)], 1e-5) << "head " << h << " entry " << e;
    }
  }
}

TEST(CpuKvWrite, PutsEveryHeadSliceAtItsBlockAndSlot) {
  auto be = make_cpu_backend();
  KvBlockLayout L;
  L.n_kv_heads = 3;
  L.head_dim = 4;
  L.block_size = 5;
  const int n_blocks = 12;
  Pool pool(*be, L, n_blocks);
  const float sentinel = -12345.0f;
  pool.fill(sentinel);
  // Two sequences: one writes entries [3, 12) (crossing two block boundaries), one writes entries [10, 11).
  const std::vector<std::vector<int32_t>> tables = {{7, 2, 9}, {4, 11, 0}};
  const std::vector<SeqSpec> specs = {{3, 9}, {10, 1}};
  const std::vector<int> q_begin = {1, 0};  // token row 0 is the second sequence's decode token
  const int n_tokens = 10, cols = L.n_kv_heads * L.head_dim;
  std::vector<float> k(size_t(n_tokens * cols)), v(k.size());
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = float(i) + 0.25f;
    v[i] = -float(i) - 0.5f;
  }
  std::vector<AttentionSequence> seqs;
  for (size_t s = 0; s < specs.size(); ++s) seqs.push_back({q_begin[s], specs[s].n_q, specs[s].n_ctx_before, tables[s]});
  Tensor tk = to_device(*be, k, n_tokens, cols), tv = to_device(*be, v, n_tokens, cols);
  be->kv_write(tk, tv, seqs, pool.view);

  // Every written slot holds its token's head slice...
  std::vector<bool> written(size_t(n_blocks * L.block_size), false);
  for (size_t s = 0; s < specs.size(); ++s) {
    for (int i = 0; i < specs[s].n_q; ++i) {
      const int entry = specs[s].n_ctx_before + i;
      const int32_t block = tables[s][size_t(entry / L.block_size)];
      const int slot = entry % L.block_size;
      written[size_t(block * L.block_size + slot)] = true;
      for (int h = 0; h < L.n_kv_heads; ++h) {
        for (int d = 0; d < L.head_dim; ++d) {
          const size_t src = size_t((q_begin[s] + i) * cols + h * L.head_dim + d);
          ASSERT_EQ(pool.k(block, h, slot)[d], k[src]) << "seq " << s << " entry " << entry << " head " << h;
          ASSERT_EQ(pool.v(block, h, slot)[d], v[src]) << "seq " << s << " entry " << entry << " head " << h;
        }
      }
    }
  }
  // ...and nothing else was touched.
  for (int b = 0; b < n_blocks; ++b) {
    for (int slot = 0; slot < L.block_size; ++slot) {
      if (written[size_t(b * L.block_size + slot)]) continue;
      for (int h = 0; h < L.n_kv_heads; ++h) {
        for (int d = 0; d < L.head_dim; ++d) {
          ASSERT_EQ(pool.k(b, h, slot)[d], sentinel) << "block " << b << " slot " << slot;
          ASSERT_EQ(pool.v(b, h, slot)[d], sentinel) << "block " << b << " slot " << slot;
        }
      }
    }
  }
}

// kv_compact: entry kept[j] moves to entry j.
class CpuKvCompact : public ::testing::Test {
 protected:
  static constexpr int kEntries = 14;
  void SetUp() override {
    L.n_kv_heads = 2;
    L.head_dim = 3;
    L.block_size = 4;
    pool = std::make_unique<Pool>(*be, L, 9);
    pool->fill(-1.0f);
    for (int e = 0; e < kEntries; ++e) {
      for (int h = 0; h < L.n_kv_heads; ++h) {
        for (int d = 0; d < L.head_dim; ++d) {
          pool->k_entry(table, e, h)[d] = value(e, h, d, false);
          pool->v_entry(table, e, h)[d] = value(e, h, d, true);
        }
      }
    }
  }
  static float value(int entry, int head, int d, bool is_v) {
    return float(entry * 100 + head * 10 + d) + (is_v ? 0.5f : 0.0f);
  }
  void compact_and_check(const std::vector<int32_t>& kept) {
    be->kv_compact(table, kept, pool->view, -1);
    for (size_t j = 0; j < kept.size(); ++j) {
      for (int h = 0; h < L.n_kv_heads; ++h) {
        for (int d = 0; d < L.head_dim; ++d) {
          ASSERT_EQ(pool->k_entry(table, int(j), h)[d], value(kept[j], h, d, false)) << "entry " << j;
          ASSERT_EQ(pool->v_entry(table, int(j), h)[d], value(kept[j], h, d, true)) << "entry " << j;
        }
      }
    }
  }
  std::unique_ptr<Backend> be = make_cpu_backend();
  KvBlockLayout L;
  std::unique_ptr<Pool> pool;
  const std::vector<int32_t> table = {6, 1, 8, 3};  // 16 slots for 14 entries, non-contiguous
};

TEST_F(CpuKvCompact, MovesKeptEntriesToTheFront) {
  compact_and_check({0, 2, 3, 6, 7, 8, 12, 13});  // moves within a block and across blocks
}

TEST_F(CpuKvCompact, KeepingAllChangesNothing) {
  std::vector<int32_t> all(kEntries);
  std::iota(all.begin(), all.end(), 0);
  compact_and_check(all);
}

TEST_F(CpuKvCompact, KeepingNoneTouchesNothing) {
  std::vector<float> before(pool->storage.f32(), pool->storage.f32() + pool->storage.size());
  be->kv_compact(table, {}, pool->view, -1);
  EXPECT_TRUE(std::equal(before.begin(), before.end(), pool->storage.f32()));
}

TEST_F(CpuKvCompact, KeepingTheLastOnly) { compact_and_check({kEntries - 1}); }

TEST_F(CpuKvCompact, KeepingASuffixAndEveryOtherEntry) {
  compact_and_check({1, 3, 5, 7, 9, 11, 13});
}

TEST_F(CpuKvCompact, RandomSelections) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 20; ++trial) {
    SetUp();
    std::vector<int32_t> kept;
    for (int e = 0; e < kEntries; ++e) {
      if (rng() % 2) kept.push_back(e);
    }
    compact_and_check(kept);
  }
}

}  // namespace
}  // namespace strata
