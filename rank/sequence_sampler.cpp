#include "rank/sequence_sampler.h"

#include <algorithm>

namespace strata {
namespace {

// 53 random bits -> [0, 1). Written out rather than std::uniform_real_distribution, whose output is
// implementation-defined: a seed must give the same tokens whatever standard library built the daemon.
double uniform01(std::mt19937_64& rng) {
  return static_cast<double>(rng() >> 11) * 0x1.0p-53;
}

}  // namespace

SequenceSampler::SequenceSampler(const SamplingRule& params, uint64_t seed) : params_(params), rng_(seed) {}

RowSampling SequenceSampler::next(std::span<const uint64_t> allowed) {
  penalties_ = params_.logit_bias;
  penalties_.reserve(params_.logit_bias.size() + counts_.size());  // no reallocation below: biased_end stays valid
  const auto biased_end = penalties_.begin() + std::ptrdiff_t(params_.logit_bias.size());
  if (params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f) {
    for (const auto& [id, count] : counts_) {
      const float amount = params_.presence_penalty + params_.frequency_penalty * static_cast<float>(count);
      // One entry per id: a biased token's penalty adds to its bias.
      auto biased = std::lower_bound(penalties_.begin(), biased_end, id,
                                     [](const TokenPenalty& p, int32_t key) { return p.id < key; });
      if (biased != biased_end && biased->id == id) {
        biased->amount += amount;
      } else {
        penalties_.push_back({id, amount});
      }
    }
  }
  RowSampling s;
  s.temperature = params_.temperature;
  s.top_k = params_.top_k;
  s.top_p = params_.top_p;
  s.min_p = params_.min_p;
  s.n_logprobs = params_.n_logprobs;
  s.uniform = params_.temperature > 0.0f ? uniform01(rng_) : 0.0;
  s.penalties = penalties_;
  s.allowed = allowed;
  return s;
}

void SequenceSampler::accept(int32_t id) { ++counts_[id]; }

}  // namespace strata
