#pragma once
// What the cache stores of the policies' decisions, as observations (cache/observation.h): the codebook vectors of
// layers whose entries were replaced by codebooks (SpindleKV) and the entries held without their own keys (PoD).
// The rank's reporter adds them to its report, so that /metrics and /v1/kv_state show them as they show a
// policy's own observations, without naming them.
#include <span>
#include <vector>

#include "cache/kv_cache.h"
#include "cache/layer_metric.h"
#include "cache/observation.h"

namespace strata {

// The per-layer series that observe_layer_storage feeds.
std::span<const LayerMetric> storage_metrics();

// A layer over all its sequences (KvCache::layer_usage): the amounts that are not 0.
void observe_layer_storage(const LayerUsage& usage, std::vector<Observation>& out);

// One sequence's layer: its codebook sizes (keys and values apart) once it has codebooks, and its entries without
// keys when it has any.
void observe_sequence_storage(const KvCache& cache, SeqId seq, int global_layer, std::vector<Observation>& out);

}  // namespace strata
