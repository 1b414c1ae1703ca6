#pragma once
// LayerStates and PolicyContexts for policy tests, built by hand.
#include <vector>

#include "cache/compression_policy.h"

namespace strata::test {

// When a sequence starts: only the prompt length is known.
inline LayerState start(int prompt_len) {
  LayerState s;
  s.prompt_len = prompt_len;
  return s;
}

// At the end of a prompt of n tokens. sums: [n_heads][n], row-major; an empty vector gives no statistics.
inline LayerState prompt_end(int n, const std::vector<float>& sums) {
  LayerState s;
  s.prompt_len = n;
  s.n_entries = n;
  s.column_sums = sums.empty() ? nullptr : sums.data();
  s.sums_stride = n;
  return s;
}

// At any hook: n_entries held, n_generated tokens generated (0 at the prompt's end). sums: [n_heads][n_entries],
// row-major, or empty for none; keys: what a policy may ask of the layer's keys (D2O), or none.
inline LayerState at(int prompt_len, int n_entries, int n_generated, const std::vector<float>& sums,
                     const LayerKeys* keys = nullptr) {
  LayerState s;
  s.prompt_len = prompt_len;
  s.n_entries = n_entries;
  s.n_generated = n_generated;
  s.column_sums = sums.empty() ? nullptr : sums.data();
  s.sums_stride = n_entries;
  s.keys = keys;
  return s;
}

// Layer `layer` of n_layers, with n_heads query heads over n_kv_heads KV heads.
inline PolicyContext policy_context(int n_heads, int n_kv_heads, int layer = 0, int n_layers = 1) {
  PolicyContext context;
  context.global_layer = layer;
  context.n_layers_total = n_layers;
  context.n_heads = n_heads;
  context.n_kv_heads = n_kv_heads;
  return context;
}

}  // namespace strata::test
