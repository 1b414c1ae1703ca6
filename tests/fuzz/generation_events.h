#pragma once
// The events an engine would send for a request (leader/generation.h), for harnesses that drive the response side
// of the protocol: per choice one delta (with a logprob entry when asked) and its end, then the request's end.
#include <cstdint>
#include <vector>

#include "leader/generation.h"

namespace strata::fuzz {

inline std::vector<GenerationEvent> generation_events(const GenerationRequest& request) {
  std::vector<GenerationEvent> events;
  const bool logprobs = request.sampling.n_logprobs >= 0;
  for (int choice = 0; choice < request.n; ++choice) {
    ChoiceDelta delta{choice, " Paris", {7042}, {}};
    if (logprobs) {
      std::vector<std::pair<std::string, float>> top(size_t(request.sampling.n_logprobs), {" Lyon", -2.5f});
      delta.logprobs.push_back(LogprobEntry{" Paris", 7042, -0.25f, std::move(top)});
    }
    events.emplace_back(std::move(delta));
    events.emplace_back(ChoiceFinished{choice, FinishReason::stop});
  }
  events.emplace_back(RequestFinished{Usage{int(request.prompt_ids.size()), request.n, 0}});
  return events;
}

}  // namespace strata::fuzz
