#pragma once
// SpindleKV's codebooks of one layer (docs/compression.md "SpindleKV"): what the cache keeps of them, and how a
// full-precision layer's entries become codebook references: Algorithm 1 per KV head, keys and values apart
// (Backend::kv_codebook_build), then one encoding per head for the backend to write. No collective: codebooks are
// per (sequence, layer, KV head) of this rank, so tensor-parallel ranks build theirs alone (spec section 11).
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "kernels/backend.h"
#include "kernels/kv_codebook.h"

namespace strata {

// A layer's codebooks (SpindleKV): per KV head one for keys (before RoPE) and one for values.
struct LayerCodebook {
  float key_threshold = 0.0f;   // a new key joins the closest entry when their cosine exceeds this
  float value_threshold = 0.0f;
  std::vector<std::vector<int32_t>> keys, values;  // [n_kv_heads]: vector ids of the codebook's entries
  std::vector<int32_t> pages;   // full-precision slots holding the vectors, filled in order
  int32_t n_vectors = 0;        // vectors written into pages
  int32_t n_coded = 0;          // entries [0, n_coded) are coded
  int32_t open_block = -1;      // the coded block of the partial group, or -1

  int64_t size() const;         // codebook vectors, every head, keys and values
};

// One KV head's codebooks as host indices, before any vector is allocated: for keys and for values, each entry's
// codebook entry (assign) and the entry whose unit vector each codebook entry holds (centres).
struct HeadCodebookPlan {
  std::vector<int32_t> k_assign, k_centres, v_assign, v_centres;
};

// Throws std::invalid_argument unless positions holds one list, or one per KV head, of one position per entry.
void check_codebook_positions(std::span<const std::vector<int32_t>> positions, int n_kv_heads, int n_entries);

// The original positions of KV head h's entries, from one list for every head or one per head.
const std::vector<int32_t>& head_positions(std::span<const std::vector<int32_t>> positions, int h);

// Algorithm 1 over the first n_entries entries of every KV head of block_table (all in full-precision blocks).
std::vector<HeadCodebookPlan> plan_codebooks(Backend& backend, const KvPoolView& pool,
                                             std::span<const int32_t> block_table,
                                             std::span<const std::vector<int32_t>> positions, int n_entries,
                                             float key_threshold, float value_threshold);

// The codebook vectors the plans need, every head, keys and values.
int64_t codebook_vectors(std::span<const HeadCodebookPlan> plans);

// KV head h's encoding of its plan: per centre a new codebook vector from next_vector, added to the head's
// codebooks in cb, and every entry referring to its codebook entry. The caller adds the coded blocks.
KvCodebookEncoding head_encoding(const HeadCodebookPlan& plan, int h, const std::vector<int32_t>& positions,
                                 LayerCodebook& cb, const std::function<int32_t()>& next_vector);

}  // namespace strata
