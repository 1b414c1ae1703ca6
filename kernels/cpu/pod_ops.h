#pragma once
// PoD's CPU reference ops (kernels/pod_attention.h): attention with shared distant logits, and the pairing of a
// follower layer's key-free blocks.
#include <cstdint>
#include <span>

#include "kernels/backend.h"
#include "kernels/pod_attention.h"

namespace strata::cpu {

void pod_attention(const float* q, std::span<const AttentionSequence> seqs, std::span<const PodDistant> distant,
                   const KvPoolView& pool, int n_heads, float scale, const PodWindow& window, float* out);
void kv_pair_values(std::span<const int32_t> first, std::span<const int32_t> second, const KvPoolView& pool);

}  // namespace strata::cpu
