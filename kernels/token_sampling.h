#pragma once
// Choosing a token from a logits row, carried out where the logits are (Backend::sample_rows), so that only the
// token and its logprobs reach the host. The sequence's state stays on the host (rank/sequence_sampler.h): its RNG and
// its counts of generated tokens become a RowSampling, the penalties to subtract and the one uniform number a draw
// consumes. A seeded request therefore draws the same tokens on every backend, up to the rounding of sums when the
// uniform number falls on the boundary between two tokens.
//
// The rule every backend follows, on one row x of V logits:
//  0. With a mask (structured output: the tokens a grammar allows), x[id] = -inf for every token it does not
//     allow, before everything else: the argmax, the filters, the draw and the logprobs all see the masked row, so
//     a masked-out token is never chosen and weighs 0 (the logprobs are a log_softmax over the allowed tokens, and
//     the top n hold only allowed tokens: fewer than n when the mask allows fewer). A mask that allows no token
//     (the grammar never makes one) or has the wrong number of words throws std::invalid_argument (check_mask).
//     Penalties on masked-out ids leave them at -inf.
//  1. x[id] -= amount for every penalty (distinct ids).
//  2. The order of the row: the larger logit first, the lower id first among equal logits. Every filter keeps a
//     prefix of this order, so the tokens kept are always its first n.
//  3. temperature <= 0: the first token of the order (argmax); the uniform number is not used.
//     Otherwise the weights are w = exp((x - max) / temperature) and the kept prefix is the shortest of:
//       top_k > 0  the first top_k tokens;
//       top_p < 1  the shortest prefix of the top_k tokens whose weights reach top_p times the top_k tokens' total;
//       min_p > 0  the tokens with w >= min_p, i.e. p >= min_p * p(max).
//     The draw walks the kept tokens in ascending id order and takes the first whose running sum of weights
//     exceeds uniform * (their total); when rounding runs past the end, the last kept token with a weight.
//  4. n_logprobs >= 0: log_softmax of the penalised row at temperature 1, for the chosen token and for the first
//     n_logprobs tokens of the order.
#include <cstdint>
#include <span>
#include <vector>

#include "kernels/token_mask_layout.h"

namespace strata {

struct TokenPenalty {
  int32_t id = 0;
  float amount = 0.0f;  // subtracted from the logit: presence + frequency * count, minus any logit_bias
};

// The rule's settings a sequence keeps for every token it samples: what a request asks for (the OpenAI
// completion parameters, validated by routing/) and what every rank that samples needs of it. When to stop is the
// leader's business (leader/sampling_params.h adds it).
struct SamplingRule {
  float temperature = 1.0f;        // 0 = greedy
  float top_p = 1.0f;              // nucleus mass kept, (0, 1]
  int top_k = 0;                   // 0 = off
  float min_p = 0.0f;              // drop tokens below min_p * p(max); 0 = off
  float presence_penalty = 0.0f;   // [-2, 2], subtracted once from the logit of every token already generated
  float frequency_penalty = 0.0f;  // [-2, 2], times the count of each generated token
  int n_logprobs = -1;             // -1: no logprobs; k >= 0: the chosen token's logprob and the top k
  // OpenAI's logit_bias as penalties (amount = -bias), ascending distinct ids: added to the counts' penalties of
  // step 1 for every token, so they act before everything else and the logprobs see them.
  std::vector<TokenPenalty> logit_bias;
};

struct RowSampling {
  float temperature = 0.0f;
  int top_k = 0;          // <= 0: off
  float top_p = 1.0f;     // >= 1: off
  float min_p = 0.0f;     // <= 0: off
  int n_logprobs = -1;    // < 0: none
  double uniform = 0.0;   // in [0, 1): the draw, from the sequence's RNG
  std::span<const TokenPenalty> penalties;
  // Empty: every token allowed. Otherwise a mask of the allowed tokens (kernels/token_mask_layout.h); the bits
  // past the last column are ignored.
  std::span<const uint64_t> allowed;
};

// Whether a mask (empty: none) allows token id.
constexpr bool token_allowed(std::span<const uint64_t> allowed, int64_t id) {
  return allowed.empty() || mask_has(allowed, id);
}

struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0.0f;
};

struct RowSample {
  int32_t id = 0;
  float logprob = 0.0f;            // of the chosen token, when n_logprobs >= 0
  std::vector<TokenLogprob> top;   // the n_logprobs most likely, most likely first
};

// Throws std::invalid_argument unless every penalised id is a column of the row and no id comes twice: what every
// backend checks before it touches a row.
void check_penalties(std::span<const TokenPenalty> penalties, int64_t n_columns);
// The number of tokens the mask allows (n_columns when it is empty). Throws std::invalid_argument, naming the row
// when row >= 0, unless it is empty or holds mask_words(n_columns) words that allow at least one column.
int64_t check_mask(std::span<const uint64_t> allowed, int64_t n_columns, int64_t row = -1);

// The rule on a host row (the CPU backend's op, and the host's for rows that are already there). The row is
// scratch: the mask and the penalties are applied to it in place.
RowSample sample_row_on_host(std::span<float> logits, const RowSampling& sampling);

}  // namespace strata
