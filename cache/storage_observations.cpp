#include "cache/storage_observations.h"

namespace strata {
namespace {

constexpr LayerMetric kStorageMetrics[] = {
    {"codebook_vectors", "strata_kv_layer_codebook_vectors", MetricType::gauge,
     "SpindleKV codebook entries held by one layer (keys and values)."},
    {"shared_keys", "strata_kv_layer_shared_keys", MetricType::gauge,
     "PoD: entries one layer holds without their keys (its block leader's are used)."},
};

int64_t entries(const std::vector<std::vector<int32_t>>& per_head) {
  int64_t n = 0;
  for (const std::vector<int32_t>& head : per_head) n += int64_t(head.size());
  return n;
}

}  // namespace

std::span<const LayerMetric> storage_metrics() { return kStorageMetrics; }

void observe_layer_storage(const LayerUsage& usage, std::vector<Observation>& out) {
  if (usage.codebook_vectors) out.push_back({"codebook_vectors", usage.codebook_vectors});
  if (usage.shared_key_entries) out.push_back({"shared_keys", usage.shared_key_entries});
}

void observe_sequence_storage(const KvCache& cache, SeqId seq, int global_layer, std::vector<Observation>& out) {
  if (const std::optional<LayerCodebook>& codebook = cache.layer(seq, global_layer).codebook) {
    out.push_back({"codebook.keys", entries(codebook->keys)});
    out.push_back({"codebook.values", entries(codebook->values)});
  }
  const int64_t shared_keys = cache.sequence_usage(seq, global_layer).shared_key_entries;
  if (shared_keys) out.push_back({"shared_keys", shared_keys});
}

}  // namespace strata
