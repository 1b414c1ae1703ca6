#include "eval/shared_prefill.h"

#include <algorithm>
#include <memory>

namespace strata {

JobStart job_start(const PolicySpec& policy, PolicyContext context, int prompt_len, int prefill_chunk) {
  LayerState start;
  start.prompt_len = prompt_len;
  bool sums_every_row = false;
  int first_window_row = prompt_len;  // the first row a layer sums when it sums a window at the prompt's end
  for (int l = 0; l < context.n_layers_total; ++l) {
    context.global_layer = l;
    const std::unique_ptr<CompressionPolicy> p = make_policy(policy, context);
    // PoD changes the KV later layers compute; the shared prefill keeps no query moments.
    if (p->traits().shared_keys || p->needs(start).query_moments_from >= 0) return {JobStart::own_prefill};
    const int from = p->needs(start).prefill_rows_from;
    if (from == 0) sums_every_row = true;
    if (from > 0) first_window_row = std::min(first_window_row, from);
  }
  if (first_window_row == prompt_len) return {JobStart::fork_prefilled};
  const int entries = first_window_row / prefill_chunk * prefill_chunk;
  // Layers that sum every row beside layers that sum a window: the source's sums serve only the first kind.
  if (sums_every_row || entries == 0) return {JobStart::own_prefill};
  return {JobStart::fork_prefix, entries};
}

}  // namespace strata
