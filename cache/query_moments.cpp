#include "cache/query_moments.h"

#include <algorithm>
#include <stdexcept>

namespace strata {
namespace {

// Rows are summed in float over blocks of this many, then added to the double sums: the float sums of a block
// lose about 2^-24 * kRowBlock relative, far below what a selection can tell, and vectorise twice as wide.
constexpr int64_t kRowBlock = 64;

}  // namespace

QueryMoments::QueryMoments(int n_heads, int head_dim)
    : n_heads_(n_heads),
      head_dim_(head_dim),
      shift_(size_t(n_heads) * size_t(head_dim), 0.0f),
      sum_(size_t(n_heads) * size_t(head_dim), 0.0),
      outer_(size_t(n_heads) * size_t(head_dim) * size_t(head_dim), 0.0) {
  if (n_heads <= 0 || head_dim <= 0) throw std::invalid_argument("QueryMoments: no heads");
}

void QueryMoments::add_rows(const float* q, int64_t n_rows, int64_t row_stride) {
  const int d = head_dim_;
  if (rows_ == 0 && n_rows > 0) {
    std::copy(q, q + int64_t(n_heads_) * d, shift_.begin());
  }
  std::vector<float> block_sum(static_cast<size_t>(d)), block_outer(static_cast<size_t>(d) * size_t(d));
  std::vector<float> x(static_cast<size_t>(d));
  for (int h = 0; h < n_heads_; ++h) {
    const float* shift = shift_.data() + int64_t(h) * d;
    for (int64_t r0 = 0; r0 < n_rows; r0 += kRowBlock) {
      std::fill(block_sum.begin(), block_sum.end(), 0.0f);
      std::fill(block_outer.begin(), block_outer.end(), 0.0f);
      for (int64_t r = r0; r < std::min(n_rows, r0 + kRowBlock); ++r) {
        const float* row_q = q + r * row_stride + int64_t(h) * d;
        float* xs = x.data();
        for (int i = 0; i < d; ++i) xs[i] = row_q[i] - shift[i];
        for (int i = 0; i < d; ++i) {
          block_sum[size_t(i)] += xs[i];
          float* __restrict row = block_outer.data() + int64_t(i) * d;
          const float xi = xs[i];
          for (int j = 0; j < d; ++j) row[j] += xi * xs[j];
        }
      }
      double* sum = sum_.data() + int64_t(h) * d;
      double* outer = outer_.data() + int64_t(h) * d * d;
      for (int i = 0; i < d; ++i) sum[i] += block_sum[size_t(i)];
      for (int64_t i = 0; i < int64_t(d) * d; ++i) outer[i] += block_outer[size_t(i)];
    }
  }
  rows_ += n_rows;
}

std::vector<double> QueryMoments::mean(int head) const {
  if (rows_ == 0) throw std::logic_error("QueryMoments: no rows");
  const double* sum = sum_.data() + int64_t(head) * head_dim_;
  const float* shift = shift_.data() + int64_t(head) * head_dim_;
  std::vector<double> mu(static_cast<size_t>(head_dim_));
  for (int i = 0; i < head_dim_; ++i) mu[size_t(i)] = double(shift[i]) + sum[i] / double(rows_);
  return mu;
}

std::vector<double> QueryMoments::covariance(int head) const {
  if (rows_ == 0) throw std::logic_error("QueryMoments: no rows");
  const int d = head_dim_;
  const double* outer = outer_.data() + int64_t(head) * d * d;
  const double* sum = sum_.data() + int64_t(head) * d;
  std::vector<double> cov(static_cast<size_t>(d) * size_t(d));
  // E[(q - s)(q - s)^T] - (mu - s)(mu - s)^T, with mu - s = sum / rows.
  for (int i = 0; i < d; ++i) {
    for (int j = 0; j < d; ++j) {
      cov[size_t(i) * d + j] = outer[int64_t(i) * d + j] / double(rows_) - sum[i] * sum[j] / (double(rows_) * rows_);
    }
  }
  return cov;
}

}  // namespace strata
