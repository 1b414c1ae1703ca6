#include "cache/prefix_reuse.h"

#include <algorithm>
#include <memory>

namespace strata {

PrefixReuse prefix_reuse(const CompressionConfig& config, const std::optional<PolicySpec>& request,
                         PolicyContext context, int prompt_len) {
  PrefixReuse reuse;
  reuse.max_cached_tokens = std::max(0, prompt_len - 1);
  LayerState start;
  start.prompt_len = prompt_len;
  start.compression_point = config.compression_point(0, prompt_len);
  for (int l = 0; l < context.n_layers_total; ++l) {
    context.global_layer = l;
    const std::unique_ptr<CompressionPolicy> policy = make_policy(request ? *request : config.for_layer(l), context);
    if (policy->traits().shared_keys) return PrefixReuse{0, false};
    reuse.copies = reuse.copies || !policy->traits().keeps_every_entry;
    const PolicyNeeds needs = policy->needs(start);
    for (int from : {needs.prefill_rows_from, needs.query_moments_from}) {
      if (from >= 0) reuse.max_cached_tokens = std::min(reuse.max_cached_tokens, from);
    }
  }
  // Chunked: the cached part ends before the first compression point, which the sequence then reaches itself.
  if (reuse.copies && config.chunked() && start.point() < prompt_len) {
    reuse.max_cached_tokens = std::min(reuse.max_cached_tokens, start.point() - 1);
    reuse.max_published_tokens = start.point();
  }
  return reuse;
}

}  // namespace strata
