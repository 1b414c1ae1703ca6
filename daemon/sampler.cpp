#include "daemon/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstddef>

namespace strata {
namespace {

using Candidate = std::pair<float, int32_t>;  // (logit, later its weight; token id)

// Most likely first; equal values go to the lower id, so every selection is reproducible.
bool more_likely(const Candidate& a, const Candidate& b) {
  return a.first > b.first || (a.first == b.first && a.second < b.second);
}

// 53 random bits -> [0, 1). Written out rather than std::uniform_real_distribution, whose output is
// implementation-defined: a seed must give the same tokens whatever standard library built the daemon.
double uniform01(std::mt19937_64& rng) {
  return static_cast<double>(rng() >> 11) * 0x1.0p-53;
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

// Moves the smallest most-likely-first prefix whose weights reach `target` to the front and returns its length;
// the order inside the prefix is left unspecified. A selection by halving, O(V) expected: nth_element splits the
// undecided range in two, and the mass of the upper half says which half holds the end of the prefix. Only the
// last few candidates get sorted, however large the nucleus (a flat distribution can need thousands of tokens).
size_t take_nucleus(std::vector<Candidate>& candidates, double target) {
  size_t lo = 0;                    // [0, lo) is in the prefix
  size_t hi = candidates.size();    // [0, hi) holds at least the target mass (or is everything)
  double taken = 0.0;               // mass of [0, lo)
  while (hi - lo > 64) {
    size_t mid = lo + (hi - lo) / 2;
    std::nth_element(candidates.begin() + lo, candidates.begin() + mid, candidates.begin() + hi, more_likely);
    double upper = 0.0;
    for (size_t i = lo; i < mid; ++i) upper += candidates[i].first;
    if (taken + upper >= target) {
      hi = mid;
    } else {
      taken += upper;
      lo = mid;
    }
  }
  std::sort(candidates.begin() + lo, candidates.begin() + hi, more_likely);
  for (size_t i = lo; i < hi; ++i) {
    taken += candidates[i].first;
    if (taken >= target) return i + 1;
  }
  return hi;  // rounding left the sum just short of the target
}

// Temperature > 0: keeps the candidates that survive top_k, top_p and min_p (in that order, each over what the
// previous kept) and draws one in proportion to exp(logit / T). Nothing is fully sorted: top_k is a selection,
// min_p a threshold and top_p the halving selection above.
int32_t draw(std::span<const float> logits, const SamplingParams& params, std::vector<Candidate>& candidates,
             std::mt19937_64& rng) {
  candidates.clear();
  for (size_t i = 0; i < logits.size(); ++i) candidates.emplace_back(logits[i], static_cast<int32_t>(i));

  if (params.top_k > 0 && static_cast<size_t>(params.top_k) < candidates.size()) {
    auto kth = candidates.begin() + params.top_k;
    std::nth_element(candidates.begin(), kth, candidates.end(), more_likely);
    candidates.erase(kth, candidates.end());
  }

  // Logits become weights exp((x - max) / T): relative probabilities, 1 for the most likely token.
  float max = candidates[0].first;
  for (const Candidate& c : candidates) max = std::max(max, c.first);
  const float inv_temperature = 1.0f / params.temperature;
  double mass = 0.0;
  for (Candidate& c : candidates) {
    c.first = std::exp((c.first - max) * inv_temperature);
    mass += c.first;
  }

  // Two thresholds on the weight, which both cut a least-likely tail:
  //  - min_p keeps p >= min_p * p(max), i.e. weight >= min_p. Renormalising over any kept set that holds the
  //    most likely token leaves that test unchanged, so it may run before top_p;
  //  - tokens under (1 - top_p) * mass / n weigh less than 1 - top_p all together, so none is in the nucleus.
  // Most of a real vocabulary falls under the second, which leaves the nucleus search a short list. top_p's target
  // is still the mass taken above, over the top_k set.
  float floor = std::min(params.min_p, 1.0f);  // the most likely token (weight 1) always stays
  if (params.top_p < 1.0f) {
    floor = std::max(floor, static_cast<float>((1.0 - params.top_p) * mass / static_cast<double>(candidates.size())));
  }
  if (floor > 0.0f) std::erase_if(candidates, [&](const Candidate& c) { return c.first < floor; });
  size_t n_kept = params.top_p < 1.0f ? take_nucleus(candidates, params.top_p * mass) : candidates.size();

  double kept_mass = 0.0;
  for (size_t i = 0; i < n_kept; ++i) kept_mass += candidates[i].first;
  double target = uniform01(rng) * kept_mass;
  for (size_t i = 0; i < n_kept; ++i) {
    target -= candidates[i].first;
    if (target < 0.0) return candidates[i].second;
  }
  // Rounding ran past the end: the last candidate with any weight.
  for (size_t i = n_kept; i-- > 0;) {
    if (candidates[i].first > 0.0f) return candidates[i].second;
  }
  return candidates[0].second;
}

}  // namespace

SequenceSampler::SequenceSampler(const SamplingParams& params, uint64_t seed) : params_(params), rng_(seed) {}

SampleResult SequenceSampler::sample(std::span<float> logits) {
  for (const auto& [id, count] : counts_) {
    logits[id] -= params_.presence_penalty + params_.frequency_penalty * static_cast<float>(count);
  }

  SampleResult result;
  // Greedy is decided by the logits alone and leaves the RNG untouched.
  result.id = params_.temperature <= 0.0f ? argmax(logits) : draw(logits, params_, scratch_, rng_);

  if (params_.n_logprobs >= 0) {
    LogSumExp lse = log_sum_exp(logits);
    auto logprob = [&](int32_t id) { return static_cast<float>(logits[id] - lse.max - lse.log_sum); };
    result.logprob = logprob(result.id);

    size_t n_top = std::min(static_cast<size_t>(params_.n_logprobs), logits.size());
    scratch_.clear();
    for (size_t i = 0; i < logits.size(); ++i) scratch_.emplace_back(logits[i], static_cast<int32_t>(i));
    std::partial_sort(scratch_.begin(), scratch_.begin() + n_top, scratch_.end(), more_likely);
    result.top.reserve(n_top);
    for (size_t i = 0; i < n_top; ++i) result.top.push_back({scratch_[i].second, logprob(scratch_[i].second)});
  }
  return result;
}

void SequenceSampler::accept(int32_t id) { ++counts_[id]; }

}  // namespace strata
