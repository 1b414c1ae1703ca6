#pragma once
// One sequence's sampling state: its RNG and the counts of the tokens it generated. The choice itself is made
// where the logits are (Backend::sample_rows, the rule of kernels/token_sampling.h); what the host contributes is
// a RowSampling per token: the penalties from the counts and the uniform number a draw consumes. The same inputs
// and RNG state give the same token.
//
// Order of operations (as vLLM and the OpenAI API behave):
//   0. a structured-output mask, when the step carries one, leaves only the tokens it allows;
//   1. logit_bias, and presence / frequency penalties from the counts of tokens generated so far, on the raw logits;
//   2. logprobs are taken from log_softmax of the penalised logits at temperature 1 (what the model "thinks");
//   3. temperature == 0 -> argmax (ties: lowest id); otherwise logits / temperature, then top_k, top_p, min_p
//      filters, renormalise, draw with the sequence's RNG.
#include <cstdint>
#include <random>
#include <span>
#include <unordered_map>
#include <vector>

#include "kernels/token_sampling.h"

namespace strata {

class SequenceSampler {
 public:
  // seed: the request's when given; otherwise one the leader drew.
  SequenceSampler(const SamplingRule& params, uint64_t seed);

  // How to choose the next token: call once per token, as it takes the draw's number from the RNG (greedy
  // sequences leave the RNG untouched). The penalties it points to stay valid until the next call; `allowed` (the
  // step's mask for this token, empty: none) is the caller's and must outlive the sampling.
  RowSampling next(std::span<const uint64_t> allowed = {});
  // next(allowed), carried out on a host logits row of vocab_size floats (modified in place).
  RowSample sample(std::span<float> logits, std::span<const uint64_t> allowed = {}) {
    return sample_row_on_host(logits, next(allowed));
  }
  // Records a token the sequence generated (updates penalty counts). Neither of the above calls it.
  void accept(int32_t id);

  const SamplingRule& params() const { return params_; }

 private:
  SamplingRule params_;
  std::mt19937_64 rng_;
  std::unordered_map<int32_t, int32_t> counts_;
  std::vector<TokenPenalty> penalties_;
};

}  // namespace strata
