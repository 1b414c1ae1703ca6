#pragma once
// The server's KV compression configuration: one policy for all layers, with per-layer overrides, e.g.
//   policy:          "pyramidkv:budget=128"
//   layer_overrides: "0-1=full;28-29=snapkv:budget=256"
// A request that names its own policy (the API's kv_compression field) replaces all of it for its sequences.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cache/policy_spec.h"

namespace strata {

struct PolicyContext;  // cache/compression_policy.h

struct LayerOverride {
  int first_layer = 0;  // global layer indices, inclusive
  int last_layer = 0;
  PolicySpec policy;
};

// KVzip's request to reconstruct a chunk, in the served model's token ids (daemon/runtime.cpp makes them with its
// tokenizer and chat template): the instruction, which the chunk's first tokens follow, and the end of the user's
// turn with the opening of the assistant's, which the chunk follows (cache/scoring_tokens.h).
struct ReconstructionPrompt {
  std::vector<int32_t> instruction;
  std::vector<int32_t> answer_start;
};

struct CompressionConfig {
  PolicySpec policy;
  std::vector<LayerOverride> overrides;  // the last matching one wins
  // kv_cache.prefill_compression: 0 (`end`) runs the policies once the prompt is whole; N > 0 (`chunked`, with
  // kv_cache.prefill_chunk N) also compresses after every N prompt positions, so that a layer never holds more
  // than its budget plus N entries while the prompt is prefilled (docs/compression.md, chunked prefill).
  int prefill_chunk = 0;
  // `auto`: prefill_chunk applies to a sequence only where every layer's policy for it has a chunked form and one
  // of them compresses; the others run as `end`. for_sequence() decides; chunked() is asked of its result.
  bool chunked_where_possible = false;
  ReconstructionPrompt reconstruction{};

  const PolicySpec& for_layer(int global_layer) const;
  // What a sequence under `request` (the request's policy in every layer, or the configuration's policies) runs
  // with: this configuration, with `auto` decided for it. context: any layer's (its global_layer is replaced).
  // Throws std::invalid_argument when a layer needs a chunked prefill (KVzip) and another has no chunked form.
  CompressionConfig for_sequence(const std::optional<PolicySpec>& request, PolicyContext context) const;
  // Throws std::logic_error under `auto` (chunked_where_possible), which depends on the sequence: for_sequence.
  bool chunked() const;
  // The prompt position at which the compression after position `pos` runs, for a prefill of prefill_len
  // tokens: the next multiple of prefill_chunk above pos (chunked), or the prefill's end.
  int compression_point(int pos, int prefill_len) const;
};

// "A-B=spec;C=spec;..." (empty: none). Throws PolicyError for malformed text or an invalid policy.
std::vector<LayerOverride> parse_layer_overrides(std::string_view text);

}  // namespace strata
