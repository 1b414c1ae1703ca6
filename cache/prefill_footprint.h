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

// Chunked prefill: how many of the prefill's last tokens run after each chunk that ends at a compression point
// before the prefill's end, for their attention only (LayerState::scoring_rows): the longest observation window
// the sequence's layers ask for (CompressionPolicy::prefill_scoring_window). 0 when none asks, or when another
// layer sums prompt rows or their query moments for itself (H2O, Expected Attention), whose sums the scoring rows
// would join: the observation-window layers then score by the chunk's own last rows. The leader, which sends the
// tokens, and every rank, which drops their entries, compute the same number.
int prefill_scoring_rows(const CompressionConfig& config, const std::optional<PolicySpec>& request,
                         PolicyContext context, int prefill_len);

// Per global layer, for a prefill of prefill_len tokens. context: any layer's (its global_layer is replaced);
// request: the request's policy, or the configuration's.
std::vector<int> prefill_peak_entries(const CompressionConfig& config, const std::optional<PolicySpec>& request,
                                      PolicyContext context, int prefill_len);

}  // namespace strata
