#pragma once
// Chooses the next token of one sequence from its logits row, and reports log-probabilities.
// Pure over plain data (no model, no cache): the same inputs and RNG state give the same token.
//
// Order of operations (as vLLM and the OpenAI API behave):
//   1. presence / frequency penalties on the raw logits, from the counts of tokens generated so far;
//   2. logprobs are taken from log_softmax of the penalised logits at temperature 1 (what the model "thinks");
//   3. temperature == 0 -> argmax (ties: lowest id); otherwise logits / temperature, then top_k, top_p, min_p
//      filters, renormalise, draw with the sequence's RNG.
#include <cstdint>
#include <random>
#include <span>
#include <unordered_map>
#include <vector>

#include "daemon/sampling_params.h"

namespace strata {

struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0.0f;
};

struct SampleResult {
  int32_t id = 0;
  float logprob = 0.0f;                  // of the chosen token (when params.n_logprobs >= 0)
  std::vector<TokenLogprob> top;         // the n_logprobs most likely, most likely first
};

// Per-sequence sampler state: the RNG and the counts of generated tokens (for the penalties).
class SequenceSampler {
 public:
  // seed: params.seed when given; otherwise the engine passes a random one.
  SequenceSampler(const SamplingParams& params, uint64_t seed);

  // logits: one row of vocab_size floats; it may be modified in place (scratch).
  SampleResult sample(std::span<float> logits);
  // Records a token the sequence generated (updates penalty counts). sample() does not call it itself.
  void accept(int32_t id);

  const SamplingParams& params() const { return params_; }
  // sample() would return the row's argmax and nothing else: greedy, no penalties to apply to the logits first,
  // no logprobs to report. The caller may then find the argmax where the logits are (LogitsMode::argmax).
  bool argmax_only() const {
    return params_.temperature <= 0.0f && params_.presence_penalty == 0.0f && params_.frequency_penalty == 0.0f &&
           params_.n_logprobs < 0;
  }

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::unordered_map<int32_t, int32_t> counts_;
  std::vector<std::pair<float, int32_t>> scratch_;
};

}  // namespace strata
