#pragma once
// How one request chooses its tokens (the OpenAI completion parameters, validated by routing/).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace strata {

struct SamplingParams {
  float temperature = 1.0f;        // 0 = greedy
  float top_p = 1.0f;              // nucleus mass kept, (0, 1]
  int top_k = 0;                   // 0 = off
  float min_p = 0.0f;              // drop tokens below min_p * p(max); 0 = off
  float presence_penalty = 0.0f;   // [-2, 2], subtracted once from the logit of every token already generated
  float frequency_penalty = 0.0f;  // [-2, 2], times the count of each generated token
  std::optional<uint64_t> seed;    // same seed, same prompt, same params -> same output
  int max_tokens = 16;
  std::vector<std::string> stop;   // stop strings; the text returned ends before them
  bool ignore_eos = false;
  int n_logprobs = -1;             // -1: no logprobs; k >= 0: the chosen token's logprob and the top k
};

}  // namespace strata
