#include "cache/policies/selection.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>

namespace strata {

std::vector<std::vector<float>> reduce_to_kv_heads(const float* sums, int stride, int n_heads, int n_kv_heads,
                                                   int n_cols, HeadReduction reduction) {
  if (n_kv_heads <= 0 || n_heads < n_kv_heads || n_heads % n_kv_heads != 0) {
    throw std::invalid_argument("reduce_to_kv_heads: " + std::to_string(n_kv_heads) + " KV heads do not divide " +
                                std::to_string(n_heads) + " query heads");
  }
  const int group = n_heads / n_kv_heads;
  std::vector<std::vector<float>> out(n_kv_heads, std::vector<float>(n_cols));
  for (int g = 0; g < n_kv_heads; ++g) {
    std::vector<float>& row = out[g];
    std::copy_n(sums + int64_t(g * group) * stride, n_cols, row.begin());
    for (int h = g * group + 1; h < (g + 1) * group; ++h) {
      const float* src = sums + int64_t(h) * stride;
      for (int j = 0; j < n_cols; ++j) {
        row[j] = reduction == HeadReduction::max ? std::max(row[j], src[j]) : row[j] + src[j];
      }
    }
    if (reduction == HeadReduction::mean) {
      for (float& v : row) v /= float(group);
    }
  }
  return out;
}

std::vector<float> pool1d(std::span<const float> scores, int kernel, Pooling pooling) {
  if (kernel < 1 || kernel % 2 == 0) {
    throw std::invalid_argument("pool1d: the kernel must be odd and positive, got " + std::to_string(kernel));
  }
  if (pooling == Pooling::none || kernel == 1) return {scores.begin(), scores.end()};
  const int n = int(scores.size());
  const int half = kernel / 2;
  std::vector<float> out(n);
  for (int i = 0; i < n; ++i) {
    // Only the real cells of the window [i - half, i + half]: max ignores the padding, and for avg the zero padding
    // adds nothing to the sum while the divisor stays `kernel`.
    const int lo = std::max(0, i - half), hi = std::min(n - 1, i + half);
    if (pooling == Pooling::max) {
      out[i] = *std::max_element(scores.begin() + lo, scores.begin() + hi + 1);
    } else {
      out[i] = std::accumulate(scores.begin() + lo, scores.begin() + hi + 1, 0.0f) / float(kernel);
    }
  }
  return out;
}

std::vector<int32_t> top_k(std::span<const float> scores, int k) {
  const int n = int(scores.size());
  if (k < 0 || k > n) {
    throw std::invalid_argument("top_k: k = " + std::to_string(k) + " outside [0, " + std::to_string(n) + "]");
  }
  std::vector<int32_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  auto key = [&](int32_t i) {
    const float s = scores[i];
    return std::isnan(s) ? -std::numeric_limits<float>::infinity() : s;
  };
  // A strict total order (indices are distinct), so the k selected are the same whatever nth_element does inside.
  auto before = [&](int32_t a, int32_t b) {
    const float sa = key(a), sb = key(b);
    return sa != sb ? sa > sb : a < b;
  };
  std::nth_element(idx.begin(), idx.begin() + k, idx.end(), before);
  idx.resize(k);
  std::sort(idx.begin(), idx.end());
  return idx;
}

Selection select_top_plus_window(const LayerState& state, int n_heads, int n_kv_heads, int window, int keep,
                                 const WindowScoring& scoring) {
  const int n = state.n_entries;
  const int scored = n - window;
  if (window < 0 || scored < 0 || keep < 0 || keep > scored) {
    throw std::invalid_argument("select_top_plus_window: keep " + std::to_string(keep) + " + window " +
                                std::to_string(window) + " do not fit " + std::to_string(n) + " entries");
  }
  Selection selection;
  selection.kept.reserve(n_kv_heads);
  // Window columns are dropped, not renormalised (spec section 2, step 4).
  for (const std::vector<float>& head :
       reduce_to_kv_heads(state.column_sums, state.sums_stride, n_heads, n_kv_heads, scored, scoring.reduction)) {
    std::vector<int32_t> kept = top_k(pool1d(head, scoring.kernel, scoring.pooling), keep);
    for (int j = scored; j < n; ++j) kept.push_back(j);
    selection.kept.push_back(std::move(kept));
  }
  return selection;
}

std::optional<std::vector<int>> pyramid_budgets_official(int n_layers, int prompt_len, int capacity, int window,
                                                         int beta) {
  const int n = prompt_len, w = window, L = n_layers;
  if (n < capacity) return std::nullopt;
  const int a = capacity - w;
  if (n < 2 * a || L == 1) return std::vector<int>(L, a);
  int lo = a / beta;
  int hi = 2 * a - lo;
  if (hi >= n - w) {
    hi = n - w;
    lo = 2 * a - hi;
  }
  const int step = (hi - lo) / (L - 1);
  std::vector<int> k(L);
  for (int l = 0; l < L; ++l) k[l] = hi - l * step;
  return k;
}

std::optional<std::vector<int>> pyramid_budgets_exact(int n_layers, int prompt_len, int capacity, int window,
                                                      int beta) {
  const int64_t n = prompt_len, w = window, L = n_layers, b = beta;
  if (n < capacity) return std::nullopt;
  const int64_t a = capacity - w;
  if (L == 1) return std::vector<int>(1, int(a));
  // k_l = num_l / den exactly. Unclamped: k_l = hi - (hi - lo) l / (L - 1) with lo = a / b, hi = 2a - a / b, i.e.
  // num_l = (2ab - a)(L - 1) - 2a(b - 1) l over den = b (L - 1). Clamped (hi = n - w, lo = 2a - hi):
  // num_l = hi (L - 1) - (hi - lo) l over den = L - 1.
  std::vector<int64_t> num(L);
  int64_t den;
  if (2 * a * b - a > (n - w) * b) {
    const int64_t hi = n - w, lo = 2 * a - hi;
    den = L - 1;
    for (int64_t l = 0; l < L; ++l) num[l] = hi * (L - 1) - (hi - lo) * l;
  } else {
    den = b * (L - 1);
    for (int64_t l = 0; l < L; ++l) num[l] = (2 * a * b - a) * (L - 1) - 2 * a * (b - 1) * l;
  }
  std::vector<int> k(L);
  int64_t missing = L * a;
  for (int l = 0; l < L; ++l) {
    k[l] = int(num[l] / den);
    missing -= k[l];
  }
  std::vector<int> order(L);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return num[x] % den > num[y] % den; });
  for (int i = 0; i < missing; ++i) ++k[order[i]];
  return k;
}

std::optional<int> entries_after_chunked_points(int point, int chunk, const std::function<int(int)>& budget_at) {
  if (chunk <= 0 || point <= 0 || point % chunk != 0) return std::nullopt;
  int entries = 0;
  for (int p = chunk; p <= point; p += chunk) entries = std::min(entries + chunk, budget_at(p));
  return entries;
}

}  // namespace strata
