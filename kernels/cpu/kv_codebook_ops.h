#pragma once
// The CPU reference of SpindleKV's codebook ops (Backend::kv_codebook_build, kv_codebook_match,
// kv_codebook_encode; kernels/kv_codebook.h), and the rotation attention applies to coded keys.
#include <cstdint>
#include <span>

#include "kernels/kv_block_layout.h"
#include "kernels/kv_codebook.h"

namespace strata::cpu {

int kv_codebook_build(std::span<const int32_t> block_table, int head, KvPart part, std::span<const int32_t> positions,
                      float threshold, const KvPoolView& pool, std::span<int32_t> assignment,
                      std::span<int32_t> centres);
void kv_codebook_match(std::span<const int32_t> block_table, int head, KvPart part, std::span<const int32_t> entries,
                       std::span<const int32_t> positions, std::span<const int32_t> codebook, const KvPoolView& pool,
                       std::span<float> best_similarity, std::span<int32_t> best_index);
void kv_codebook_encode(std::span<const int32_t> block_table, const KvCodebookEncoding& encoding,
                        const KvPoolView& pool);

// The reconstructed key of a coded row: RoPE(k_magnitude * C[k_vector], position), into out[head_dim].
void coded_key(const KvPoolView& pool, const KvCodeRow& row, float* out);

}  // namespace strata::cpu
