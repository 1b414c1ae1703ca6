#pragma once
// The tokens of chunked prefill's scoring rows (ScoringRows in cache/compression_policy.h) at a compression point:
//   - the prompt's tail: the prefill's last `count` tokens;
//   - the chunk's reconstruction (KVzip): instruction + the chunk's first h tokens + answer_start + the chunk,
//     with h = min(8, chunk) and the chunk the prefill_chunk tokens before the point. kvpress's KVzipPress asks
//     "Repeat the part of the previous context exactly, starting with" and the previous chunk's last 8 tokens for
//     every chunk after the first, and asks the first to be repeated whole; the chunk's own first tokens give one
//     form, and one count, for every chunk (docs/decisions.md, [shared-compressed]).
// The leader sends them; the ranks need only their count, which both compute from the configuration.
#include <cstdint>
#include <span>
#include <vector>

#include "cache/compression_config.h"
#include "cache/compression_policy.h"

namespace strata {

// Scoring rows of a chunk's reconstruction: instruction, h tokens, answer start, the chunk.
int reconstruction_rows(const ReconstructionPrompt& prompt, int prefill_chunk);

// The rows' tokens for the compression point `point` of `prefill` (a multiple of config.prefill_chunk below
// prefill.size()). Empty for ScoringSource::none.
std::vector<int32_t> scoring_tokens(const ScoringRows& rows, const CompressionConfig& config,
                                    std::span<const int32_t> prefill, int point);

}  // namespace strata
