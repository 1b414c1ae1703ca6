#pragma once
// How many KV entries each layer of a sequence holds at most while its prefill runs, under its policies: what the
// leader's scheduler admits a waiting sequence by, and what a request that cannot fit even alone is refused by.
//   - kv_cache.prefill_compression end: every layer holds the whole prefill before any policy runs;
//   - chunked: a layer whose policy bounds it (CompressionPolicy::prefill_budget) holds at most its budget plus one
//     chunk (kv_cache.prefill_chunk) before each compression; any other layer holds the whole prefill.
// The first generated token's entry is counted too: a sequence that can prefill but not take one decode step
// would stall.
#include <optional>
#include <vector>

#include "cache/compression_config.h"
#include "cache/compression_policy.h"

namespace strata {

// Per global layer, for a prefill of prefill_len tokens. context: any layer's (its global_layer is replaced);
// request: the request's policy, or the configuration's.
std::vector<int> prefill_peak_entries(const CompressionConfig& config, const std::optional<PolicySpec>& request,
                                      PolicyContext context, int prefill_len);

}  // namespace strata
