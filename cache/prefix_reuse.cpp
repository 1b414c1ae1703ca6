#include "cache/prefix_reuse.h"

#include <algorithm>
#include <memory>

namespace strata {

PrefixReuse prefix_reuse(const CompressionConfig& server_config, const std::optional<PolicySpec>& request,
                         PolicyContext context, int prompt_len) {
  const CompressionConfig config = server_config.for_sequence(request, context);
  context.prefill_chunk = config.prefill_chunk;
  PrefixReuse reuse;
  reuse.max_cached_tokens = std::max(0, prompt_len - 1);
  LayerState start;
  start.prompt_len = prompt_len;
  start.compression_point = config.compression_point(0, prompt_len);
  // The last multiple of the chunk before the prompt's end: no compression point lies after it.
  const int last_point = config.chunked() ? (prompt_len - 1) / config.prefill_chunk * config.prefill_chunk : 0;
  std::optional<int> shared_entries;
  bool query_agnostic = last_point > 0;
  for (int l = 0; l < context.n_layers_total; ++l) {
    context.global_layer = l;
    const std::unique_ptr<CompressionPolicy> policy = make_policy(request ? *request : config.for_layer(l), context);
    const std::optional<int> entries = last_point > 0 ? policy->entries_after_point(last_point) : std::nullopt;
    query_agnostic = query_agnostic && entries && (!shared_entries || *shared_entries == *entries);
    if (entries) shared_entries = entries;
    if (policy->traits().shared_keys) return PrefixReuse{0, false};
    reuse.copies = reuse.copies || !policy->traits().keeps_every_entry;
    const PolicyNeeds needs = policy->needs(start);
    for (int from : {needs.prefill_rows_from, needs.query_moments_from}) {
      if (from >= 0) reuse.max_cached_tokens = std::min(reuse.max_cached_tokens, from);
    }
  }
  if (query_agnostic) {
    reuse.compressed_point = last_point;
    reuse.compressed_entries = *shared_entries;
  }
  // Chunked: the cached part ends before the first compression point, which the sequence then reaches itself.
  if (reuse.copies && config.chunked() && start.point() < prompt_len) {
    reuse.max_cached_tokens = std::min(reuse.max_cached_tokens, start.point() - 1);
    reuse.max_published_tokens = start.point();
  }
  return reuse;
}

}  // namespace strata
