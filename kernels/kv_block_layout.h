#pragma once
// Where the keys and values of one KV block live. A block holds `block_size` consecutive cache entries of one
// layer for all of a rank's KV heads. Two formats share one pool:
//
// Full-precision blocks (every block of an unquantized pool; the "staging" blocks of a quantized pool), `dtype`
// elements (f32, f16 or bf16 on the CPU, bf16 on CUDA):
//   K: [n_kv_heads][block_size][head_dim]  then  V: [n_kv_heads][block_size][head_dim]
// Head-major inside a block so that one head's keys are contiguous for the attention dot products.
//
// Quantized blocks (kv_cache.dtype int8 | int4 | int2, KIVI: ../shared/specs/simlayerkv.md "4-bit quantization"), one
// full group of kKvQuantGroup entries. Codes are unsigned, asymmetric round-to-nearest: x ≈ min + code * scale,
// scale = (max - min) / (2^bits - 1) over the group. Keys are grouped per channel (one scale and min per (head,
// channel) over the block's 32 entries), values per token (one per (head, entry, 32 consecutive channels)):
//   K codes  [n_kv_heads][32][head_dim]          8 / bits channels a byte, channel c at bit (c % (8 / bits)) * bits
//   V codes  [n_kv_heads][32][head_dim]          likewise
//   K scale, K min  [n_kv_heads][head_dim]       fp16 each
//   V scale, V min  [n_kv_heads][32][head_dim/32]  fp16 each
// Scales and mins are fp16 as in KIVI: fp32 ones would add 2 bits to every 4-bit code, fp16 ones add 1 (int4
// takes 5 bits an entry-channel). A group is fitted in fp32, its scale and min are rounded to fp16 (saturated at
// +-65504, so a huge group clamps instead of turning to inf), and the codes are computed from the rounded pair,
// so that min + code * scale is exactly what a reader dequantizes.
// Quantized blocks are packed `quantized_per_slot()` to the memory of one full-precision block (a slot), so one
// pool and one budget serve both (cache/block_pool.h). What a packed block costs the pool is its share of a slot,
// block_bytes() / quantized_per_slot(), not its own size: the rest of the slot is unused.
//
// Coded blocks (SpindleKV, a pool without quantization, f32 or bf16; docs/compression.md "SpindleKV"): block_size
// entries whose keys and values were replaced by references to codebook vectors, one KvCodeRow per (head, entry):
//   [n_kv_heads][block_size] KvCodeRow
// A codebook vector is a unit vector of head_dim fp32 values (whatever the pool's dtype: a bf16 codebook would
// round every coded entry once more) stored in full-precision slots of the same pool; a row names it by its
// vector id: the pool seen as an array of vectors, vector i at float offset i * head_dim. Keys are coded before
// RoPE, so attention reads K = RoPE(k_magnitude * C[k_vector], position) and V = v_magnitude * C[v_vector], with
// RoPE from the view's table. Coded blocks are packed `coded_per_slot()` to a slot like quantized blocks; a pool
// packs one of the two kinds (SpindleKV rejects quantized pools).
#include <cstdint>

#include "kernels/rope_params.h"
#include "kernels/tensor.h"

namespace strata {

// The quantization group of KIVI's configuration: 32 tokens per key group, 32 channels per value group.
constexpr int kKvQuantGroup = 32;
// Bytes of one stored scale or min (fp16).
constexpr int kKvScaleBytes = 2;
// The largest finite fp16: scales and mins saturate there.
constexpr float kKvScaleMax = 65504.0f;

enum class KvQuant : uint8_t { none, int8, int4, int2 };

inline int kv_quant_bits(KvQuant q) {
  return q == KvQuant::int8 ? 8 : q == KvQuant::int4 ? 4 : q == KvQuant::int2 ? 2 : 32;
}
inline const char* kv_quant_name(KvQuant q) {
  return q == KvQuant::int8 ? "int8" : q == KvQuant::int4 ? "int4" : q == KvQuant::int2 ? "int2" : "none";
}
// The largest code: 2^bits - 1.
inline int kv_quant_levels(KvQuant q) { return (1 << kv_quant_bits(q)) - 1; }

// One coded (head, entry): 20 bytes where a full-precision f32 entry takes 8 * head_dim for K and V.
struct KvCodeRow {
  int32_t k_vector;   // codebook vector id of the key (before RoPE)
  float k_magnitude;  // the key's L2 norm
  int32_t v_vector;
  float v_magnitude;
  int32_t position;   // the entry's original position, for RoPE on read
};

struct KvBlockLayout {
  int n_kv_heads = 0;   // KV heads on this rank
  int head_dim = 0;
  int block_size = 16;  // cache entries per block
  DType dtype = DType::f32;       // elements of full-precision blocks
  KvQuant quant = KvQuant::none;  // format of sealed groups; none: every block is full precision

  // Full-precision blocks.
  int64_t elements_per_block() const { return 2LL * n_kv_heads * block_size * head_dim; }
  int64_t block_bytes() const { return elements_per_block() * dtype_bytes(dtype); }
  // Bytes one cache entry takes in one layer, K and V together, at full precision.
  int64_t entry_bytes() const { return 2LL * n_kv_heads * head_dim * dtype_bytes(dtype); }
  int64_t k_offset(int head, int slot) const { return (int64_t(head) * block_size + slot) * head_dim; }
  int64_t v_offset(int head, int slot) const {
    return int64_t(n_kv_heads) * block_size * head_dim + k_offset(head, slot);
  }

  // Quantized blocks (quant != none, block_size == kKvQuantGroup). Byte offsets from the block's start.
  int64_t code_row_bytes() const { return int64_t(head_dim) * kv_quant_bits(quant) / 8; }  // one entry, one head
  int64_t codes_bytes() const { return int64_t(n_kv_heads) * block_size * code_row_bytes(); }  // K or V
  int v_groups() const { return head_dim / kKvQuantGroup; }  // value groups per (head, entry)
  int64_t k_codes_offset(int head, int slot) const { return (int64_t(head) * block_size + slot) * code_row_bytes(); }
  int64_t v_codes_offset(int head, int slot) const { return codes_bytes() + k_codes_offset(head, slot); }
  int64_t k_scale_offset(int head) const { return 2 * codes_bytes() + int64_t(head) * head_dim * kKvScaleBytes; }
  int64_t k_min_offset(int head) const {
    return k_scale_offset(n_kv_heads) + int64_t(head) * head_dim * kKvScaleBytes;
  }
  int64_t v_scale_offset(int head, int slot) const {
    return k_min_offset(n_kv_heads) + (int64_t(head) * block_size + slot) * v_groups() * kKvScaleBytes;
  }
  int64_t v_min_offset(int head, int slot) const {
    return v_scale_offset(n_kv_heads, 0) + (int64_t(head) * block_size + slot) * v_groups() * kKvScaleBytes;
  }
  int64_t quantized_block_bytes() const { return v_min_offset(n_kv_heads, 0); }
  int quantized_per_slot() const {
    return quant == KvQuant::none ? 0 : int(block_bytes() / quantized_block_bytes());
  }

  // Coded blocks (quant == none).
  int64_t coded_block_bytes() const { return int64_t(n_kv_heads) * block_size * int64_t(sizeof(KvCodeRow)); }
  int64_t code_row_index(int head, int slot) const { return int64_t(head) * block_size + slot; }
  int coded_per_slot() const { return quant == KvQuant::none ? int(block_bytes() / coded_block_bytes()) : 0; }
  int64_t vectors_per_slot() const { return block_bytes() / (int64_t(head_dim) * 4); }  // fp32 codebook vectors
  // Small blocks packed into one slot: quantized blocks in a quantized pool, coded blocks otherwise.
  int packed_per_slot() const { return quant == KvQuant::none ? coded_per_slot() : quantized_per_slot(); }
  // The pool memory n packed blocks take: their share of the slots that hold them (a slot's bytes over the blocks
  // it packs), which counts the part of each slot too small for another block.
  int64_t packed_pool_bytes(int64_t n) const { return n == 0 ? 0 : n * block_bytes() / packed_per_slot(); }
};

// The RoPE of the model's keys, for reading coded keys: table[p * head_dim + i] = cos(p * inv_freq[i]) and
// table[p * head_dim + head_dim / 2 + i] = sin(...) for positions p < n_positions, computed exactly as the model's
// rope op computes its angles (kernels/cpu/rope.cpp), so that a coded key is rotated as the model rotates keys.
struct KvKeyRope {
  const float* table = nullptr;  // device memory of the pool's backend
  int32_t n_positions = 0;
  RopeStyle style = RopeStyle::interleaved;
};

// One layer's view of the pool for one step: the pool's base and layout. Block tables index into it. Ids below
// n_slots are full-precision blocks (slot i); in a quantized pool, id n_slots + q is quantized block q, stored as
// sub-block q % quantized_per_slot() of slot q / quantized_per_slot().
struct KvPoolView {
  void* base = nullptr;
  KvBlockLayout layout;
  int32_t n_slots = 0;
  KvKeyRope key_rope;  // set once a pool holds coded blocks

  bool is_quantized(int32_t block) const { return layout.quant != KvQuant::none && block >= n_slots; }
  // In a pool without quantization, ids from n_slots on are coded blocks, sub-block q % coded_per_slot() of slot
  // q / coded_per_slot().
  // A view with n_slots 0 (tests over bare memory) has none.
  bool is_coded(int32_t block) const { return layout.quant == KvQuant::none && n_slots > 0 && block >= n_slots; }
  KvCodeRow* block_coded(int32_t block) const {
    const int64_t q = int64_t(block) - n_slots;
    const int per_slot = layout.coded_per_slot();
    return reinterpret_cast<KvCodeRow*>(static_cast<uint8_t*>(base) + (q / per_slot) * layout.block_bytes() +
                                        (q % per_slot) * layout.coded_block_bytes());
  }
  float* codebook_vector(int32_t vector) const {
    return static_cast<float*>(base) + int64_t(vector) * layout.head_dim;
  }
  float* block_f32(int32_t block) const {
    return static_cast<float*>(base) + int64_t(block) * layout.elements_per_block();
  }
  uint8_t* block_quantized(int32_t block) const {
    const int64_t q = int64_t(block) - n_slots;
    const int per_slot = layout.quantized_per_slot();
    return static_cast<uint8_t*>(base) + (q / per_slot) * layout.block_bytes() +
           (q % per_slot) * layout.quantized_block_bytes();
  }
};

// Compaction of a layer whose table starts with n_quantized quantized blocks (full groups) and continues with
// full-precision blocks: the compacted layer keeps its first compacted_quantized_blocks() quantized blocks (as many
// as the kept entries fill, never more than it had) and holds the other kept entries in the full-precision blocks
// that follow them. Backend::kv_compact and KvCache::retain both follow this rule.
inline int compacted_quantized_blocks(int n_quantized, int n_kept) {
  return n_kept / kKvQuantGroup < n_quantized ? n_kept / kKvQuantGroup : n_quantized;
}

}  // namespace strata
