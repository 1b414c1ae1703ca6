#pragma once
// The CPU reference of D2O's cache ops (Backend::kv_nearest_keys and Backend::kv_merge), over fp32 blocks.
#include <cstdint>
#include <span>

#include "kernels/kv_block_layout.h"
#include "kernels/kv_merge.h"

namespace strata::cpu {

void kv_nearest_keys(std::span<const int32_t> block_table, int head, std::span<const int32_t> queries,
                     std::span<const int32_t> candidates, const KvPoolView& pool, std::span<float> best_similarity,
                     std::span<int32_t> best_candidate);
void kv_merge(std::span<const int32_t> block_table, const KvMerges& merges, const KvPoolView& pool, int head);

}  // namespace strata::cpu
