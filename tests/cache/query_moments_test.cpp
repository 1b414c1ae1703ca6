// QueryMoments (cache/query_moments.h) against a two-pass double mean and covariance of the same rows, added in
// pieces of several sizes as the chunks of a prefill add them, with a row stride wider than the heads.
#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "cache/query_moments.h"

namespace strata {
namespace {

TEST(QueryMoments, MeanAndCovarianceOfTheRowsAddedInPieces) {
  const int n_heads = 3, d = 8, n = 301;
  const int64_t stride = n_heads * d + 5;  // rows of a wider tensor
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> rows(size_t(n) * stride);
  // A large mean beside a small spread: the covariance is a small difference of large sums.
  for (int r = 0; r < n; ++r)
    for (int c = 0; c < n_heads * d; ++c) rows[r * stride + c] = 40.0f + float(c % 7) + 0.25f * normal(rng);
  QueryMoments moments(n_heads, d);
  int r0 = 0;
  for (int piece : {1, 64, 100, 136}) {
    moments.add_rows(rows.data() + r0 * stride, piece, stride);
    r0 += piece;
  }
  ASSERT_EQ(r0, n);
  EXPECT_EQ(moments.rows(), n);
  for (int h = 0; h < n_heads; ++h) {
    std::vector<double> mu(d, 0.0);
    for (int r = 0; r < n; ++r)
      for (int i = 0; i < d; ++i) mu[i] += rows[r * stride + h * d + i] / double(n);
    const std::vector<double> mean = moments.mean(h), cov = moments.covariance(h);
    for (int i = 0; i < d; ++i) {
      EXPECT_NEAR(mean[i], mu[i], 1e-6) << "head " << h << " dim " << i;
      for (int j = 0; j < d; ++j) {
        double c = 0.0;
        for (int r = 0; r < n; ++r) {
          c += (rows[r * stride + h * d + i] - mu[i]) * (rows[r * stride + h * d + j] - mu[j]) / double(n);
        }
        // The spread's variance is 1/16; sums of rows shifted by the first are of the spread's size.
        EXPECT_NEAR(cov[i * d + j], c, 1e-6) << "head " << h << " (" << i << ", " << j << ")";
      }
    }
  }
}

TEST(QueryMoments, NoRowsIsAnError) {
  const QueryMoments moments(2, 4);
  EXPECT_THROW(moments.mean(0), std::logic_error);
  EXPECT_THROW(QueryMoments(0, 4), std::invalid_argument);
}

}  // namespace
}  // namespace strata
