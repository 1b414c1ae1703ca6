#pragma once
// A batch of completions prompts ("prompt": ["a", "b"]) runs as one engine request per prompt, each with its own
// sink from prompt_batch_sinks; together they report to the response's sink as one request would:
// - a prompt's choice j is choice i * n + j of the response (OpenAI's order: by prompt, then by n);
// - one RequestFinished, with the usage summed, once every prompt has finished;
// - on a failure, that RequestFailed alone: the other prompts see themselves cancelled and report nothing more.
#include <memory>
#include <vector>

#include "leader/generation.h"

namespace strata {

// One sink per prompt, prompts in order; with one prompt, the response's sink itself.
std::vector<std::shared_ptr<GenerationSink>> prompt_batch_sinks(std::shared_ptr<GenerationSink> response, int prompts,
                                                                int n_per_prompt);

}  // namespace strata
