// The sampling rule of kernels/token_sampling.h on a host row. Nothing is fully sorted: top_k is a selection,
// min_p a threshold, top_p a selection by halving, and only the kept tokens are put in id order for the draw.
#include "kernels/token_sampling.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <limits>
#include <stdexcept>
#include <string>

namespace strata {
namespace {

using Candidate = std::pair<float, int32_t>;  // (logit, later its weight; token id)

// The row's order: most likely first, the lower id among equal values.
bool more_likely(const Candidate& a, const Candidate& b) {
  return a.first > b.first || (a.first == b.first && a.second < b.second);
}

// Rule step 0: the tokens the mask does not allow get -inf.
void mask_row(std::span<float> logits, std::span<const uint64_t> allowed) {
  if (allowed.empty()) return;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (!token_allowed(allowed, int64_t(i))) logits[i] = -std::numeric_limits<float>::infinity();
  }
}

int32_t argmax(std::span<const float> logits) {
  size_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best]) best = i;  // strict: ties keep the lowest id
  }
  return static_cast<int32_t>(best);
}

// max over the row and log(sum(exp(x - max))), summed in double: the logprobs are reported to the client.
struct LogSumExp {
  double max = 0.0;
  double log_sum = 0.0;
};

LogSumExp log_sum_exp(std::span<const float> logits) {
  float max = logits[0];
  for (float x : logits) max = std::max(max, x);
  double sum = 0.0;
  for (float x : logits) sum += std::exp(x - max);  // float exp: half the time of double, error far below 1e-6
  return {max, std::log(sum)};
}

// Moves the shortest most-likely-first prefix whose weights reach `target` to the front and returns its length;
// the order inside the prefix is left unspecified. The order is the row's, by logit: two logits can round to one
// weight, and the rule keeps the larger. A selection by halving, O(V) expected: nth_element splits the undecided
// range in two, and the mass of the upper half says which half holds the end of the prefix. Only the last few
// candidates get sorted, however large the nucleus (a flat distribution can need thousands of tokens).
size_t take_nucleus(std::vector<Candidate>& candidates, std::span<const float> logits, double target) {
  const auto earlier = [&](const Candidate& a, const Candidate& b) {
    return more_likely({logits[size_t(a.second)], a.second}, {logits[size_t(b.second)], b.second});
  };
  size_t lo = 0;                    // [0, lo) is in the prefix
  size_t hi = candidates.size();    // [0, hi) holds at least the target mass (or is everything)
  double taken = 0.0;               // mass of [0, lo)
  while (hi - lo > 64) {
    size_t mid = lo + (hi - lo) / 2;
    std::nth_element(candidates.begin() + lo, candidates.begin() + mid, candidates.begin() + hi, earlier);
    double upper = 0.0;
    for (size_t i = lo; i < mid; ++i) upper += candidates[i].first;
    if (taken + upper >= target) {
      hi = mid;
    } else {
      taken += upper;
      lo = mid;
    }
  }
  std::sort(candidates.begin() + lo, candidates.begin() + hi, earlier);
  for (size_t i = lo; i < hi; ++i) {
    taken += candidates[i].first;
    if (taken >= target) return i + 1;
  }
  return hi;  // rounding left the sum just short of the target
}

// Masked-out tokens (weight 0) are left out of the candidates: they are never drawn, and the filters keep the same
// allowed tokens without them (they come last in the order).
int32_t draw(std::span<const float> logits, const RowSampling& s) {
  std::vector<Candidate> candidates;
  candidates.reserve(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) {
    if (token_allowed(s.allowed, int64_t(i))) candidates.emplace_back(logits[i], static_cast<int32_t>(i));
  }

  if (s.top_k > 0 && static_cast<size_t>(s.top_k) < candidates.size()) {
    auto kth = candidates.begin() + s.top_k;
    std::nth_element(candidates.begin(), kth, candidates.end(), more_likely);
    candidates.erase(kth, candidates.end());
  }

  // Logits become weights exp((x - max) / T): relative probabilities, 1 for the most likely token.
  float max = candidates[0].first;
  for (const Candidate& c : candidates) max = std::max(max, c.first);
  const float inv_temperature = 1.0f / s.temperature;
  double mass = 0.0;
  for (Candidate& c : candidates) {
    c.first = std::exp((c.first - max) * inv_temperature);
    mass += c.first;
  }

  // Two thresholds on the weight, which both cut a least-likely tail:
  //  - min_p keeps weight >= min_p. Renormalising over any kept set that holds the most likely token leaves that
  //    test unchanged, so it may run before top_p;
  //  - tokens under (1 - top_p) * mass / n weigh less than 1 - top_p all together, so none is in the nucleus.
  // Most of a real vocabulary falls under the second, which leaves the nucleus search a short list. top_p's target
  // is still the mass taken above, over the top_k set.
  float floor = std::min(s.min_p, 1.0f);  // the most likely token (weight 1) always stays
  if (s.top_p < 1.0f) {
    floor = std::max(floor, static_cast<float>((1.0 - s.top_p) * mass / static_cast<double>(candidates.size())));
  }
  if (floor > 0.0f) std::erase_if(candidates, [&](const Candidate& c) { return c.first < floor; });
  const size_t n_kept = s.top_p < 1.0f ? take_nucleus(candidates, logits, s.top_p * mass) : candidates.size();
  candidates.resize(n_kept);

  // The draw walks the kept tokens in id order: the order every backend can reproduce.
  std::sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) { return a.second < b.second; });
  double kept_mass = 0.0;
  for (const Candidate& c : candidates) kept_mass += c.first;
  double target = s.uniform * kept_mass;
  for (const Candidate& c : candidates) {
    target -= c.first;
    if (target < 0.0) return c.second;
  }
  for (size_t i = candidates.size(); i-- > 0;) {
    if (candidates[i].first > 0.0f) return candidates[i].second;
  }
  return candidates[0].second;
}

}  // namespace

void check_penalties(std::span<const TokenPenalty> penalties, int64_t n_columns) {
  std::vector<int32_t> ids;
  ids.reserve(penalties.size());
  for (const TokenPenalty& p : penalties) {
    if (p.id < 0 || p.id >= n_columns) {
      throw std::invalid_argument("sample_rows: penalised token " + std::to_string(p.id) + " is outside the " +
                                  std::to_string(n_columns) + " columns");
    }
    ids.push_back(p.id);
  }
  std::sort(ids.begin(), ids.end());
  if (auto twice = std::adjacent_find(ids.begin(), ids.end()); twice != ids.end()) {
    throw std::invalid_argument("sample_rows: token " + std::to_string(*twice) + " is penalised twice");
  }
}

int64_t check_mask(std::span<const uint64_t> allowed, int64_t n_columns, int64_t row) {
  if (allowed.empty()) return n_columns;
  const auto fail = [&](const std::string& what) {
    throw std::invalid_argument("sample_rows: " + (row >= 0 ? "row " + std::to_string(row) + ": " : "") + what);
  };
  if (int64_t(allowed.size()) != mask_words(n_columns)) {
    fail("a mask of " + std::to_string(allowed.size()) + " words for " + std::to_string(n_columns) +
         " columns (needs " + std::to_string(mask_words(n_columns)) + ")");
  }
  int64_t count = 0;
  for (size_t w = 0; w + 1 < allowed.size(); ++w) count += std::popcount(allowed[w]);
  const int64_t columns_in_last = n_columns - 64 * (int64_t(allowed.size()) - 1);  // 1 to 64
  const uint64_t last_columns = columns_in_last == 64 ? ~uint64_t(0) : (uint64_t(1) << columns_in_last) - 1;
  count += std::popcount(allowed.back() & last_columns);
  if (count == 0) fail("the mask allows no token");
  return count;
}

RowSample sample_row_on_host(std::span<float> logits, const RowSampling& s) {
  const int64_t n_allowed = check_mask(s.allowed, int64_t(logits.size()));
  check_penalties(s.penalties, int64_t(logits.size()));
  mask_row(logits, s.allowed);
  for (const TokenPenalty& p : s.penalties) logits[size_t(p.id)] -= p.amount;

  RowSample result;
  result.id = s.temperature <= 0.0f ? argmax(logits) : draw(logits, s);

  if (s.n_logprobs >= 0) {
    const LogSumExp lse = log_sum_exp(logits);
    auto logprob = [&](int32_t id) { return static_cast<float>(logits[size_t(id)] - lse.max - lse.log_sum); };
    result.logprob = logprob(result.id);

    const size_t n_top = std::min(static_cast<size_t>(s.n_logprobs), static_cast<size_t>(n_allowed));
    std::vector<Candidate> order;
    order.reserve(static_cast<size_t>(n_allowed));
    for (size_t i = 0; i < logits.size(); ++i) {
      if (token_allowed(s.allowed, int64_t(i))) order.emplace_back(logits[i], static_cast<int32_t>(i));
    }
    std::partial_sort(order.begin(), order.begin() + n_top, order.end(), more_likely);
    result.top.reserve(n_top);
    for (size_t i = 0; i < n_top; ++i) result.top.push_back({order[i].second, logprob(order[i].second)});
  }
  return result;
}

}  // namespace strata
