#pragma once
// How one request chooses its tokens and when it stops (the OpenAI completion parameters, validated by routing/).
// The choice itself is the SamplingRule every rank that samples follows (kernels/token_sampling.h); the seed, the
// length limit and the stop conditions stay with the leader.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kernels/token_sampling.h"

namespace strata {

struct SamplingParams : SamplingRule {
  std::optional<uint64_t> seed;    // same seed, same prompt, same params -> same output
  int max_tokens = 16;
  std::vector<std::string> stop;   // stop strings; the text returned ends before them
  bool ignore_eos = false;
  int min_tokens = 0;              // the stop tokens are masked out until this many are generated
};

}  // namespace strata
