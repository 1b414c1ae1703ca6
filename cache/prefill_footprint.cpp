#include "cache/prefill_footprint.h"

#include <algorithm>
#include <memory>

namespace strata {

std::vector<int> prefill_peak_entries(const CompressionConfig& config, const std::optional<PolicySpec>& request,
                                      PolicyContext context, int prefill_len) {
  std::vector<int> peak(size_t(context.n_layers_total), prefill_len + 1);
  if (!config.chunked()) return peak;
  for (int l = 0; l < context.n_layers_total; ++l) {
    context.global_layer = l;
    const std::unique_ptr<CompressionPolicy> policy = make_policy(request ? *request : config.for_layer(l), context);
    if (const std::optional<int> budget = policy->prefill_budget(prefill_len)) {
      peak[size_t(l)] = std::min(prefill_len + 1, *budget + config.prefill_chunk);
    }
  }
  return peak;
}

}  // namespace strata
