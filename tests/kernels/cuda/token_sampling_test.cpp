// The CUDA backend's sample_rows (kernels/cuda/token_sampling.cu) against the CPU backend's, which is the rule's
// reference (kernels/token_sampling.h), on rows of the model vocabularies' sizes. Without a GPU (or without a
// CUDA build) every test reports itself skipped with the reason.
//
// Tolerances. Both backends subtract the penalties with the same float operation and order tokens by exact
// comparisons of logits, so the penalised rows, the greedy tokens, the top_k sets and the tokens of the top
// logprobs (and their order) must be equal. The weights exp((x - max) / T) differ by expf's rounding alone (CUDA's
// expf is within 2 ulp, glibc's within 1: < 3e-7 relative each), and their sums by the order of the double
// additions (~1e-16): every cumulative weight, the total and the top_p target agree to < 1e-6 of the total. So a
// drawn token may differ only where the uniform number lies that close to the boundary between two kept tokens,
// or where a top_p or min_p cut lies that close to a token. Such draws are found on the host in double
// (draw_is_on_a_boundary, with a margin of 1e-5: ten times the bound) and excused, counted: they must stay rare;
// every other draw must give the CPU's token. Logprobs are log-sum-exps of the same weights at T = 1: within
// 1e-4 absolute (the rounding is ~1e-6 on logprobs down to -60).
#ifdef STRATA_HAVE_CUDA

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/token_sampling.h"
#include "tests/kernels/random_token_mask.h"

namespace strata {
namespace {

using test::random_mask;

constexpr double kBoundaryMargin = 1e-5;  // relative to the kept tokens' total weight; see the file comment
constexpr float kLogprobTolerance = 1e-4f;

// Rows of logits with the samplings that read them; the samplings' penalties and masks point into `penalties`
// and `masks`.
struct Batch {
  int64_t cols = 0;
  std::vector<float> logits;  // rows x cols
  std::vector<std::vector<TokenPenalty>> penalties;
  std::vector<std::vector<uint64_t>> masks;
  std::vector<RowSampling> rows;

  int64_t n_rows() const { return int64_t(rows.size()); }
  std::span<const float> row(const std::vector<float>& all, size_t r) const {
    return {all.data() + r * size_t(cols), size_t(cols)};
  }
};

// `count` distinct token ids, each with an amount in [-2, 3] (a negative penalty raises the logit).
std::vector<TokenPenalty> random_penalties(int64_t cols, int count, std::mt19937& rng) {
  std::vector<TokenPenalty> penalties;
  std::uniform_int_distribution<int32_t> id(0, int32_t(cols - 1));
  std::uniform_real_distribution<float> amount(-2.0f, 3.0f);
  while (int(penalties.size()) < std::min<int64_t>(count, cols)) {
    const int32_t candidate = id(rng);
    const bool taken = std::any_of(penalties.begin(), penalties.end(),
                                   [&](const TokenPenalty& p) { return p.id == candidate; });
    if (!taken) penalties.push_back({candidate, amount(rng)});
  }
  return penalties;
}

// True when the CPU's and the device's draw may differ by rounding alone: the rule carried out on the penalised
// row in double, with a full sort, and a cut or boundary found within `margin` (relative to the weight it is
// measured against).
bool draw_is_on_a_boundary(std::span<const float> x, const RowSampling& s, double margin) {
  const size_t n = x.size();
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); });
  const size_t top_k = s.top_k > 0 && size_t(s.top_k) < n ? size_t(s.top_k) : n;
  const double max = x[order[0]];
  std::vector<double> w(top_k);  // weights in the order
  double mass = 0.0;
  for (size_t i = 0; i < top_k; ++i) {
    w[i] = std::exp((double(x[order[i]]) - max) / double(s.temperature));
    mass += w[i];
  }

  size_t kept = top_k;
  if (s.top_p < 1.0f) {
    const double target = double(s.top_p) * mass;
    double cumulative = 0.0;
    for (size_t i = 0; i < top_k; ++i) {
      cumulative += w[i];
      if (std::fabs(cumulative - target) <= margin * mass) return true;
      if (cumulative >= target) {
        kept = i + 1;
        break;
      }
    }
  }
  if (s.min_p > 0.0f) {
    const double floor = std::min(s.min_p, 1.0f);
    size_t above = 0;
    for (size_t i = 0; i < kept; ++i) {
      if (std::fabs(w[i] - floor) <= margin) return true;
      if (w[i] >= floor) above = i + 1;
    }
    kept = above;
  }

  std::vector<std::pair<int32_t, double>> by_id;
  for (size_t i = 0; i < kept; ++i) by_id.emplace_back(order[i], w[i]);
  std::sort(by_id.begin(), by_id.end());
  double total = 0.0;
  for (const auto& [id, weight] : by_id) total += weight;
  double cumulative = 0.0;
  for (size_t i = 0; i + 1 < by_id.size(); ++i) {
    cumulative += by_id[i].second;
    if (std::fabs(cumulative / total - s.uniform) <= margin) return true;
  }
  return false;
}

class CudaTokenSampling : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << cuda_unavailable_reason();
    gpu = make_cuda_backend(0);
    cpu = make_cpu_backend();
  }

  // Both backends' samples of `b`; also checks that they leave the same penalised rows behind (the CPU's are
  // returned in cpu_logits).
  struct Samples {
    std::vector<RowSample> gpu, cpu;
    std::vector<float> cpu_logits;
  };
  Samples sample_on_both(const Batch& b) {
    Samples s{std::vector<RowSample>(b.rows.size()), std::vector<RowSample>(b.rows.size()), b.logits};
    Tensor on_gpu = gpu->alloc(b.n_rows(), b.cols, DType::f32);
    gpu->copy_from_host(b.logits.data(), on_gpu);
    gpu->sample_rows(on_gpu, b.rows, s.gpu);
    Tensor on_cpu{s.cpu_logits.data(), DType::f32, b.n_rows(), b.cols};
    cpu->sample_rows(on_cpu, b.rows, s.cpu);
    std::vector<float> penalised(b.logits.size());
    gpu->copy_to_host(on_gpu, penalised.data());
    gpu->free(on_gpu);
    EXPECT_TRUE(penalised == s.cpu_logits) << "the penalised logits differ (cols " << b.cols << ")";
    return s;
  }

  std::unique_ptr<Backend> gpu, cpu;
  std::mt19937 rng{20260311};
};

// The same top tokens in the same order, and logprobs within kLogprobTolerance; the chosen token's logprob where
// both chose the same token.
void expect_logprobs_match(const RowSample& got, const RowSample& want, const std::string& what) {
  if (got.id == want.id) {
    EXPECT_NEAR(got.logprob, want.logprob, kLogprobTolerance) << what;
  }
  ASSERT_EQ(got.top.size(), want.top.size()) << what;
  for (size_t j = 0; j < want.top.size(); ++j) {
    EXPECT_EQ(got.top[j].id, want.top[j].id) << what << ", top " << j;
    EXPECT_NEAR(got.top[j].logprob, want.top[j].logprob, kLogprobTolerance) << what << ", top " << j;
  }
}

// Greedy rows: exactly the CPU's token. Maxima planted repeatedly across rows (so that threads, warps and the
// block all meet equal values), -0 before +0 as the largest value, and a token lifted to the top by a negative
// penalty, over rows of the model vocabularies' sizes.
TEST_F(CudaTokenSampling, GreedyRowsMatchTheCpuWithTies) {
  for (int64_t cols : {int64_t(1), int64_t(31), int64_t(49152), int64_t(128256)}) {
    Batch b;
    b.cols = cols;
    const int64_t rows = 7;
    std::uniform_real_distribution<float> value(-4.0f, 4.0f);
    b.logits.resize(size_t(rows * cols));
    for (float& x : b.logits) x = value(rng);
    const auto at = [&](int64_t r, int64_t c) -> float& { return b.logits[size_t(r * cols + c)]; };
    for (int64_t r = 1; r < 5; ++r) {
      for (int64_t c = (r * 977) % cols; c < cols; c += 257 * r) at(r, c) = 6.0f;
    }
    for (int64_t c = 0; c < cols; ++c) at(5, c) = -1.0f - std::fabs(at(5, c));
    at(5, cols / 2) = -0.0f;
    at(5, cols - 1) = 0.0f;
    b.penalties = {random_penalties(cols, 1, rng)};
    b.penalties[0][0].amount = -20.0f;
    b.rows.resize(size_t(rows));
    b.rows[6].penalties = b.penalties[0];
    b.rows[2].n_logprobs = 5;
    const Samples s = sample_on_both(b);
    for (size_t r = 0; r < b.rows.size(); ++r) {
      EXPECT_EQ(s.gpu[r].id, s.cpu[r].id) << "cols " << cols << ", row " << r;
      expect_logprobs_match(s.gpu[r], s.cpu[r], "cols " + std::to_string(cols) + ", row " + std::to_string(r));
    }
  }
}

// Draws with penalties over temperatures, top_k, top_p and min_p and many uniform numbers; logprobs on some rows.
// Logits are normal with a standard deviation of 3, a spread like a model's: from a few kept tokens to thousands.
TEST_F(CudaTokenSampling, DrawsMatchTheCpuAwayFromBoundaries) {
  int compared = 0, on_a_boundary = 0;
  for (int64_t cols : {int64_t(1000), int64_t(49152), int64_t(128256)}) {
    std::normal_distribution<float> logit(0.0f, 3.0f);
    std::uniform_real_distribution<double> uniform(0.0, 1.0);
    for (float temperature : {0.7f, 1.0f, 1.3f}) {
      for (int top_k : {0, 1, 50, int(cols)}) {
        for (float top_p : {0.5f, 0.9f, 1.0f}) {
          for (float min_p : {0.0f, 0.05f}) {
            Batch b;
            b.cols = cols;
            const std::vector<double> uniforms = {0.0, 0.37, 0.999, uniform(rng), uniform(rng), uniform(rng)};
            b.logits.resize(uniforms.size() * size_t(cols));
            for (float& x : b.logits) x = logit(rng);
            for (size_t r = 0; r < uniforms.size(); ++r) b.penalties.push_back(random_penalties(cols, 40, rng));
            for (size_t r = 0; r < uniforms.size(); ++r) {
              RowSampling s;
              s.temperature = temperature;
              s.top_k = top_k;
              s.top_p = top_p;
              s.min_p = min_p;
              s.uniform = uniforms[r];
              s.n_logprobs = std::vector<int>{-1, 0, 5, 20}[r % 4];
              s.penalties = b.penalties[r];
              b.rows.push_back(s);
            }
            const Samples got = sample_on_both(b);
            for (size_t r = 0; r < b.rows.size(); ++r) {
              const RowSampling& s = b.rows[r];
              const std::string what = "cols " + std::to_string(cols) + ", T " + std::to_string(temperature) +
                                       ", top_k " + std::to_string(top_k) + ", top_p " + std::to_string(top_p) +
                                       ", min_p " + std::to_string(min_p) + ", u " + std::to_string(s.uniform);
              if (got.gpu[r].id == got.cpu[r].id) {
                ++compared;
              } else if (draw_is_on_a_boundary(b.row(got.cpu_logits, r), s, kBoundaryMargin)) {
                ++on_a_boundary;
              } else {
                ADD_FAILURE() << what << ": drew " << got.gpu[r].id << ", the CPU " << got.cpu[r].id;
              }
              expect_logprobs_match(got.gpu[r], got.cpu[r], what);
            }
          }
        }
      }
    }
  }
  // Rounding decides a draw only within 1e-6 of a boundary: a handful of the 1,296 draws at most.
  EXPECT_LE(on_a_boundary, (compared + on_a_boundary) / 100) << compared << " draws compared";
}

// The corners of the rule: one column; top_k and n_logprobs beyond the vocabulary; min_p 1 (only the largest
// logits stay); a temperature so low that every weight but the largest underflows to 0; top_p 0 (the first
// token alone); uniform numbers at both ends.
TEST_F(CudaTokenSampling, CornerCasesMatchTheCpu) {
  for (int64_t cols : {int64_t(1), int64_t(2), int64_t(1000)}) {
    Batch b;
    b.cols = cols;
    std::normal_distribution<float> logit(0.0f, 3.0f);
    const auto add = [&](float temperature, int top_k, float top_p, float min_p, double uniform, int n_logprobs) {
      RowSampling s;
      s.temperature = temperature;
      s.top_k = top_k;
      s.top_p = top_p;
      s.min_p = min_p;
      s.uniform = uniform;
      s.n_logprobs = n_logprobs;
      b.rows.push_back(s);
      for (int64_t c = 0; c < cols; ++c) b.logits.push_back(logit(rng));
    };
    add(1.0f, 0, 1.0f, 0.0f, 0.5, 20);
    add(1.0f, int(cols) + 5, 1.0f, 0.0f, 0.0, 20);
    add(1.0f, 0, 1.0f, 1.0f, 0.7, 3);
    add(0.01f, 0, 1.0f, 0.0f, 0.999, 1);
    add(1.0f, 0, 0.0f, 0.0f, 0.3, -1);
    add(1.0f, 0, 0.9f, 0.05f, std::nextafter(1.0, 0.0), 0);
    add(1.0f, 2, 0.9f, 0.0f, 0.0, 2);
    const Samples s = sample_on_both(b);
    for (size_t r = 0; r < b.rows.size(); ++r) {
      const std::string what = "cols " + std::to_string(cols) + ", row " + std::to_string(r);
      if (s.gpu[r].id != s.cpu[r].id) {
        EXPECT_TRUE(draw_is_on_a_boundary(b.row(s.cpu_logits, r), b.rows[r], kBoundaryMargin))
            << what << ": drew " << s.gpu[r].id << ", the CPU " << s.cpu[r].id;
      }
      expect_logprobs_match(s.gpu[r], s.cpu[r], what);
    }
  }
  // min_p 1 with the largest logit repeated: both copies stay, and the draw walks them in id order.
  Batch b;
  b.cols = 5;
  for (double u : {0.2, 0.7}) {
    RowSampling s;
    s.temperature = 1.0f;
    s.min_p = 1.0f;
    s.uniform = u;
    b.rows.push_back(s);
    b.logits.insert(b.logits.end(), {1.0f, 4.0f, -2.0f, 4.0f, 3.9f});
  }
  const Samples s = sample_on_both(b);
  EXPECT_EQ(s.gpu[0].id, 1);
  EXPECT_EQ(s.gpu[1].id, 3);
  EXPECT_EQ(s.cpu[0].id, 1);
  EXPECT_EQ(s.cpu[1].id, 3);
}

// Rows with and without masks in one call: greedy rows whose mask leaves out the row's argmax, draws over sparse
// and dense masks with every filter, a one-token mask, penalties on masked tokens (one that would lift a masked
// token to the top), and logprobs that ask for more tokens than the mask allows. The masked tokens must come back
// as -inf in the penalised rows, and no chosen token may be masked.
TEST_F(CudaTokenSampling, MaskedAndUnmaskedRowsMatchTheCpu) {
  int compared = 0, on_a_boundary = 0;
  for (int64_t cols : {int64_t(1), int64_t(65), int64_t(49152), int64_t(128256)}) {
    Batch b;
    b.cols = cols;
    std::normal_distribution<float> logit(0.0f, 3.0f);
    const int n_rows = 24;
    b.logits.resize(size_t(n_rows * cols));
    for (float& x : b.logits) x = logit(rng);
    b.masks.resize(size_t(n_rows));
    b.penalties.resize(size_t(n_rows));
    for (int r = 0; r < n_rows; ++r) {
      const float* row = b.logits.data() + size_t(r) * size_t(cols);
      const int64_t best = std::max_element(row, row + cols) - row;
      const double density = std::vector<double>{0.0, 0.001, 0.3, 0.9}[size_t(r % 4)];  // 0: no mask
      if (density > 0.0) b.masks[size_t(r)] = random_mask(cols, density, (best + 1) % cols, rng);
      if (density > 0.0 && cols > 1) mask_clear(b.masks[size_t(r)], best);
      if (r == 5) b.masks[size_t(r)] = random_mask(cols, 0.0, cols / 2, rng);  // one token
      b.penalties[size_t(r)] = random_penalties(cols, 30, rng);
      if (r % 3 == 0) {  // lifts the row's argmax, masked in rows 1 to 3 mod 4, to the top
        std::erase_if(b.penalties[size_t(r)], [&](const TokenPenalty& p) { return p.id == best; });
        b.penalties[size_t(r)].push_back({int32_t(best), -40.0f});
      }
    }
    for (int r = 0; r < n_rows; ++r) {
      RowSampling s;
      s.temperature = r < 8 ? 0.0f : std::vector<float>{0.7f, 1.0f, 1.3f}[size_t(r % 3)];
      s.top_k = std::vector<int>{0, 0, 40, 3}[size_t((r / 4) % 4)];
      s.top_p = r % 5 == 0 ? 0.9f : 1.0f;
      s.min_p = r % 7 == 0 ? 0.05f : 0.0f;
      s.uniform = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
      s.n_logprobs = std::vector<int>{-1, 0, 5, 20}[size_t((r / 2) % 4)];
      s.penalties = b.penalties[size_t(r)];
      s.allowed = b.masks[size_t(r)];
      b.rows.push_back(s);
    }
    const Samples got = sample_on_both(b);
    for (size_t r = 0; r < b.rows.size(); ++r) {
      const std::string what = "cols " + std::to_string(cols) + ", row " + std::to_string(r);
      EXPECT_TRUE(token_allowed(b.rows[r].allowed, got.gpu[r].id)) << what << ": drew masked " << got.gpu[r].id;
      if (got.gpu[r].id == got.cpu[r].id) {
        ++compared;
      } else if (b.rows[r].temperature > 0.0f &&
                 draw_is_on_a_boundary(b.row(got.cpu_logits, r), b.rows[r], kBoundaryMargin)) {
        ++on_a_boundary;
      } else {
        ADD_FAILURE() << what << ": chose " << got.gpu[r].id << ", the CPU " << got.cpu[r].id;
      }
      expect_logprobs_match(got.gpu[r], got.cpu[r], what);
    }
  }
  EXPECT_LE(on_a_boundary, 2) << compared << " rows compared";
}

TEST_F(CudaTokenSampling, RejectsBadMasksNamingTheRow) {
  Tensor logits = gpu->alloc(2, 100, DType::f32);
  std::vector<RowSampling> rows(2);
  std::vector<RowSample> out(2);
  const std::vector<uint64_t> one_word = {~uint64_t(0)}, nothing = {0, ~uint64_t(0) << 36}, fine = {0, 1};
  for (const std::vector<uint64_t>* bad : {&one_word, &nothing}) {
    rows[1].allowed = *bad;
    try {
      gpu->sample_rows(logits, rows, out);
      ADD_FAILURE() << "a bad mask was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("row 1"), std::string::npos) << e.what();
    }
  }
  rows[1].allowed = fine;  // token 64 alone
  rows[1].n_logprobs = 20;
  gpu->sample_rows(logits, rows, out);
  EXPECT_EQ(out[1].id, 64);
  EXPECT_EQ(out[1].top.size(), 1u);
  gpu->free(logits);
}

TEST_F(CudaTokenSampling, RejectsBadShapes) {
  Tensor logits = gpu->alloc(2, 10, DType::f32);
  std::vector<RowSampling> rows(2);
  std::vector<RowSample> out(2), too_few(1);
  EXPECT_THROW(gpu->sample_rows(logits, rows, too_few), std::invalid_argument);
  EXPECT_THROW(gpu->sample_rows(logits, std::span<const RowSampling>(rows).first(1), too_few), std::invalid_argument);
  rows[1].n_logprobs = 21;
  EXPECT_THROW(gpu->sample_rows(logits, rows, out), std::invalid_argument);
  rows[1].n_logprobs = 20;
  for (int32_t bad_id : {-1, 10}) {
    const std::vector<TokenPenalty> penalty = {{bad_id, 1.0f}};
    rows[0].penalties = penalty;
    EXPECT_THROW(gpu->sample_rows(logits, rows, out), std::invalid_argument) << "penalty id " << bad_id;
  }
  rows[0].penalties = {};
  Tensor bf16 = gpu->alloc(2, 10, DType::bf16);
  EXPECT_THROW(gpu->sample_rows(bf16, rows, out), std::invalid_argument);
  Tensor no_columns = gpu->alloc(2, 0, DType::f32);
  EXPECT_THROW(gpu->sample_rows(no_columns, rows, out), std::invalid_argument);
  gpu->sample_rows(logits, rows, out);  // zeros: every row's first token
  EXPECT_EQ(out[0].id, 0);
  EXPECT_EQ(out[1].top.size(), 10u);
}

}  // namespace
}  // namespace strata

#endif  // STRATA_HAVE_CUDA
