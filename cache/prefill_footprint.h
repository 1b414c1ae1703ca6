#pragma once
// How many KV entries each layer of a sequence holds at most while its prefill runs, under its policies: what the
// leader's scheduler admits a waiting sequence by, and what a request that cannot fit even alone is refused by.
//   - kv_cache.prefill_compression end: every layer holds the whole prefill before any policy runs;
//   - chunked: a layer whose policy bounds it (CompressionPolicy::prefill_budget) holds at most its budget plus one
//     chunk (kv_cache.prefill_chunk) before each compression; any other layer holds the whole prefill. Both hold
//     the scoring rows besides at a compression point before the prefill's end (prefill_scoring_rows).
// The first generated token's entry is counted too: a sequence that can prefill but not take one decode step
// would stall.
#include <optional>
#include <vector>

#include "cache/compression_config.h"
#include "cache/compression_policy.h"

namespace strata {

// Chunked prefill: the scoring rows a chunk that ends at a compression point before the prefill's end carries
// (ScoringRows, LayerState::scoring_rows), from what the sequence's layers ask for
// (CompressionPolicy::prefill_scoring):
//   - a chunk's reconstruction when a layer asks for it (KVzip), cache/scoring_tokens.h's count; every other
//     layer then keeps every entry (`full`), or std::invalid_argument names the layer that does not;
//   - else the prompt's tail, as long as the longest observation window; none when another layer sums prompt rows
//     or their query moments for itself (H2O, Expected Attention), whose sums the rows would join: the
//     observation-window layers then score by the chunk's own last rows.
// The leader, which sends the tokens, and every rank, which drops their entries, compute the same rows.
ScoringRows prefill_scoring_rows(const CompressionConfig& config, const std::optional<PolicySpec>& request,
                                 PolicyContext context, int prefill_len);

// Per global layer, for a prefill of prefill_len tokens. context: any layer's (its global_layer is replaced);
// request: the request's policy, or the configuration's. Both functions decide `auto` for the sequence
// (CompressionConfig::for_sequence).
std::vector<int> prefill_peak_entries(const CompressionConfig& config, const std::optional<PolicySpec>& request,
                                      PolicyContext context, int prefill_len);

}  // namespace strata
