#include "cache/prefill_footprint.h"

#include <algorithm>
#include <memory>
#include <stdexcept>
#include <string>

#include "cache/scoring_tokens.h"

namespace strata {

ScoringRows prefill_scoring_rows(const CompressionConfig& server_config, const std::optional<PolicySpec>& request,
                                 PolicyContext context, int prefill_len) {
  const CompressionConfig config = server_config.for_sequence(request, context);
  if (!config.chunked()) return {};
  context.prefill_chunk = config.prefill_chunk;
  LayerState start;
  start.prompt_len = prefill_len;
  start.compression_point = config.compression_point(0, prefill_len);
  int tail = 0;
  bool sums_itself = false;
  int reconstructs = -1, other = -1;  // a layer of each kind, for the error
  for (int l = 0; l < context.n_layers_total; ++l) {
    context.global_layer = l;
    const std::unique_ptr<CompressionPolicy> policy = make_policy(request ? *request : config.for_layer(l), context);
    const ScoringRows asked = policy->prefill_scoring(prefill_len);
    const PolicyNeeds needs = policy->needs(start);
    if (asked.source == ScoringSource::chunk_reconstruction) {
      reconstructs = l;
      continue;
    }
    if (!policy->traits().keeps_every_entry) other = l;
    if (asked.source == ScoringSource::prompt_tail) tail = std::max(tail, asked.count);
    // Rows this layer sums or takes moments of for itself would take in the scoring rows too.
    if (asked.source == ScoringSource::none && (needs.prefill_rows_from >= 0 || needs.query_moments_from >= 0)) {
      sums_itself = true;
    }
  }
  if (reconstructs >= 0) {
    if (other >= 0) {
      auto layer = [&](int l) {
        return (request ? *request : config.for_layer(l)).name + " (layer " + std::to_string(l) + ")";
      };
      throw std::invalid_argument("policy " + layer(reconstructs) + " scores chunks by their reconstruction, which " +
                                  layer(other) + " would read too: run it in every layer that compresses, full in " +
                                  "the others");
    }
    return {ScoringSource::chunk_reconstruction, reconstruction_rows(config.reconstruction, config.prefill_chunk)};
  }
  if (sums_itself || tail == 0) return {};
  return {ScoringSource::prompt_tail, tail};
}

std::vector<int> prefill_peak_entries(const CompressionConfig& server_config, const std::optional<PolicySpec>& request,
                                      PolicyContext context, int prefill_len) {
  std::vector<int> peak(size_t(context.n_layers_total), prefill_len + 1);
  const CompressionConfig config = server_config.for_sequence(request, context);
  if (!config.chunked()) return peak;
  context.prefill_chunk = config.prefill_chunk;
  const int scoring_rows = prefill_scoring_rows(config, request, context, prefill_len).count;  // decided already
  // The last compression point before the prefill's end, where a layer that keeps everything holds the most
  // scoring rows past what it keeps.
  const int last_point = (prefill_len - 1) / config.prefill_chunk * config.prefill_chunk;
  const int whole = std::max(prefill_len + 1, last_point > 0 ? last_point + scoring_rows : 0);
  for (int l = 0; l < context.n_layers_total; ++l) {
    context.global_layer = l;
    const std::unique_ptr<CompressionPolicy> policy = make_policy(request ? *request : config.for_layer(l), context);
    peak[size_t(l)] = whole;
    if (const std::optional<int> budget = policy->prefill_budget(prefill_len)) {
      peak[size_t(l)] = std::min(whole, *budget + config.prefill_chunk + scoring_rows);
    }
  }
  return peak;
}

}  // namespace strata
