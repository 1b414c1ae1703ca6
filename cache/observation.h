#pragma once
// A named value that a compression policy, or the cache for the policies' decisions, reports about one layer
// (CompressionPolicy::observe, cache/storage_observations.h). The rank report carries observations as they are, and
// /metrics and /v1/kv_state render them by name and kind without knowing who spoke: a new policy's observations
// need no change in parallel/ or leader/ (the per-layer series they feed are declared in cache/layer_metric.h).
#include <cstdint>
#include <string>

namespace strata {

enum class ObservationKind : uint8_t {
  count,    // what happened since the reporter began (D2O: entries merged); /metrics adds up its growth
  amount,   // a quantity now (D2O: the layer's capacity; the cache: a layer's codebook vectors)
  verdict,  // a decision, 1 yes or 0 no (SimLayerKV: the layer is lazy); /metrics counts each (sequence, layer)'s
            // once, under `<name>=true` or `<name>=false`
};

struct Observation {
  // /v1/kv_state shows it as a member of the layer's object, a dot nesting it ("codebook.keys" is
  // "codebook": {"keys": ...}), so a name is none of that object's own keys (tokens, blocks, policy, ...).
  std::string name;
  int64_t value = 0;
  ObservationKind kind = ObservationKind::amount;

  bool operator==(const Observation&) const = default;
};

}  // namespace strata
