#include "rank/sequence_sampler.h"

namespace strata {
namespace {

// 53 random bits -> [0, 1). Written out rather than std::uniform_real_distribution, whose output is
// implementation-defined: a seed must give the same tokens whatever standard library built the daemon.
double uniform01(std::mt19937_64& rng) {
  return static_cast<double>(rng() >> 11) * 0x1.0p-53;
}

}  // namespace

SequenceSampler::SequenceSampler(const SamplingRule& params, uint64_t seed) : params_(params), rng_(seed) {}

RowSampling SequenceSampler::next() {
  penalties_.clear();
  if (params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f) {
    for (const auto& [id, count] : counts_) {
      penalties_.push_back({id, params_.presence_penalty + params_.frequency_penalty * static_cast<float>(count)});
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
  return s;
}

void SequenceSampler::accept(int32_t id) { ++counts_[id]; }

}  // namespace strata
