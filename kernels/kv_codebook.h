#pragma once
// SpindleKV's codebook replacement (../shared/specs/spindlekv.md section 4; docs/compression.md "SpindleKV"): the
// arguments of the Backend ops that build a codebook over a layer's entries, match new entries against one, and
// write the coded form (kernels/kv_block_layout.h: coded blocks and codebook vectors) into the pool.
//
// Keys are coded before RoPE. The cache holds post-RoPE keys, and these ops un-rotate them with the pool's key
// RoPE table at the entry's original position: RoPE is a rotation per channel pair, so the inverse is exact up to
// float rounding, and the forward pass needs no second copy of the keys.
#include <climits>
#include <cstdint>
#include <vector>

#include "kernels/rope_params.h"

namespace strata {

enum class KvPart : uint8_t { key, value };

// One KV head's coded form of the layer's entries [entry_begin, entry_begin + positions.size()), which are in
// full-precision blocks of the block table. Backend::kv_codebook_encode first writes the new codebook vectors
// (each the unit vector of one of those entries, key before RoPE or value), then one KvCodeRow per entry, then
// overwrites the entries at or after write_back_from with their reconstruction (RoPE(m * C[r], position) and
// m * C[r]): entries of a group that is not full yet stay in their full-precision block, and attention must read
// there what it would read from the codes.
struct KvCodebookEncoding {
  int head = 0;
  int entry_begin = 0;
  std::vector<int32_t> positions;                     // per entry: its original position
  std::vector<int32_t> k_vectors, v_vectors;          // per entry: codebook vector ids
  std::vector<int32_t> new_k_entries, new_k_vectors;  // vector new_k_vectors[i] := unit key of entry new_k_entries[i]
  std::vector<int32_t> new_v_entries, new_v_vectors;
  // The coded block of entry e: coded_blocks[e / block_size - entry_begin / block_size].
  std::vector<int32_t> coded_blocks;
  int write_back_from = INT_MAX;
};

// The key RoPE table of a pool (KvKeyRope): [n_positions][head_dim], cos then sin of position * inv_freq, the
// angles computed as the rope op computes them. Host memory, head_dim * n_positions floats.
void key_rope_table(int head_dim, const RopeParams& rope, int n_positions, float* table);

}  // namespace strata
