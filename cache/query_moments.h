#pragma once
// The running first and second moments of one layer's queries before RoPE, per query head, over the prompt rows a
// policy asks for (PolicyNeeds::query_moments_from): Expected Attention's statistics of the queries to come
// (cache/policies/expected_attention_policy.cpp). The forward pass adds each step's rows as it computes them, so a
// chunked prefill's moments are those of every row so far; the policy reads a head's mean and covariance at its
// compression point. The sums are of each row minus the head's first row (the shifted-data algorithm: the
// covariance of queries whose mean is large beside their spread is then not a difference of two large sums), in
// float over blocks of rows and in double across them.
#include <cstdint>
#include <vector>

namespace strata {

class QueryMoments {
 public:
  QueryMoments(int n_heads, int head_dim);

  // Adds n_rows query rows of n_heads x head_dim floats, row r at q + r * row_stride.
  void add_rows(const float* q, int64_t n_rows, int64_t row_stride);

  int n_heads() const { return n_heads_; }
  int head_dim() const { return head_dim_; }
  int64_t rows() const { return rows_; }
  // Head h's mean [head_dim] and covariance [head_dim][head_dim] (row-major) over the rows added, the covariance
  // divided by the row count (the population's, as kvpress computes it). Requires rows() > 0.
  std::vector<double> mean(int head) const;
  std::vector<double> covariance(int head) const;

 private:
  int n_heads_;
  int head_dim_;
  int64_t rows_ = 0;
  std::vector<float> shift_;   // [n_heads][head_dim]: each head's first row
  std::vector<double> sum_;    // [n_heads][head_dim]: the sum of q - shift
  std::vector<double> outer_;  // [n_heads][head_dim][head_dim]: the sum of (q - shift)(q - shift)^T
};

}  // namespace strata
