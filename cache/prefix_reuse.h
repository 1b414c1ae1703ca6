#pragma once
// What prefix caching may do for one sequence under its compression policies (the leader asks before it looks
// for cached blocks; docs/decisions.md [prefix-cache]):
//   - a policy that sums prompt rows' attention (SnapKV's observation window, H2O's accumulated scores) or their
//     query moments (Expected Attention) needs those rows computed, so the cached part ends before the first of them;
//   - the prompt's last token is always computed: its logits give the first token;
//   - a policy that may rewrite entries gets copies of the cached blocks, so that its rewrites need no memory
//     the scheduler has not counted;
//   - a policy that shares keys across layers during the prefill (PoD) changes the KV that later layers compute,
//     so its sequences neither start from cached blocks nor publish theirs;
//   - with kv_cache.prefill_compression chunked, a policy that evicts during the prefill changes the KV of every
//     token after its first compression: the sequence starts from cached blocks and publishes its own only
//     before that point.
//   - with chunked prefill and query-agnostic policies in every layer (CompressionPolicy::entries_after_point),
//     what the layers hold right after the prompt's last compression point depends on the tokens before it
//     alone: that compressed prefix may be shared with every sequence whose prompt agrees up to the point.
#include <limits>
#include <optional>

#include "cache/compression_config.h"
#include "cache/compression_policy.h"
#include "cache/policy_spec.h"

namespace strata {

struct PrefixReuse {
  int max_cached_tokens = 0;  // the leading prompt tokens whose KV may come from cached blocks
  bool may_publish = true;    // its prompt blocks hold the KV a `full` prefill writes
  // Of those, the leading prompt tokens whose blocks hold it (all of them, or those before the first chunked
  // compression).
  int max_published_tokens = std::numeric_limits<int>::max();
  // Its policies may rewrite entries (evict, merge, code): it starts from copies of the cached blocks, which take
  // pool blocks of their own, instead of sharing them.
  bool copies = false;
  // The prompt's last compression point whose compressed prefix may be shared (0: none), and the entries every
  // layer holds right after it.
  int compressed_point = 0;
  int compressed_entries = 0;
};

// context: any layer's (its global_layer is replaced); request: the request's policy, or the configuration's
// (`auto` decided for it, CompressionConfig::for_sequence).
PrefixReuse prefix_reuse(const CompressionConfig& config, const std::optional<PolicySpec>& request,
                         PolicyContext context, int prompt_len);

}  // namespace strata
