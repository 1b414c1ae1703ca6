#pragma once
// LayerKeys over one (sequence, layer) of the KV pool: the questions a policy asks about keys are answered by the
// pool's backend, where the cache lives (on a GPU, on the GPU). Valid while the layer's block table is unchanged:
// build one per hook.
#include <cstdint>
#include <span>

#include "cache/compression_policy.h"
#include "cache/kv_cache.h"

namespace strata {

class PooledLayerKeys final : public LayerKeys {
 public:
  PooledLayerKeys(const KvCache& cache, SeqId seq, int global_layer)
      : pool_(cache.pool()), block_table_(cache.layer(seq, global_layer).block_table) {}

  void nearest(int kv_head, std::span<const int32_t> queries, std::span<const int32_t> candidates,
               std::span<float> best_similarity, std::span<int32_t> best_candidate) const override {
    pool_.backend().kv_nearest_keys(block_table_, kv_head, queries, candidates, pool_.view(), best_similarity,
                                    best_candidate);
  }
  void key_forms(int kv_head, std::span<const float> linear, std::span<const float> quadratic,
                 std::span<float> forms, std::span<float> value_norms) const override {
    pool_.backend().kv_key_forms(block_table_, kv_head, linear, quadratic, pool_.view(), forms, value_norms);
  }

 private:
  const BlockPool& pool_;
  std::span<const int32_t> block_table_;
};

}  // namespace strata
