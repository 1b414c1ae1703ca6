#pragma once
// The full-precision rows of a CPU KV pool in its element type: fp32, or IEEE half / bfloat16 under kv_cache.dtype
// f16 | bf16 (half the memory; kernels/kv_block_layout.h). Rows are read as fp32 (exactly: a 16-bit value widens
// without rounding) and written from fp32 rounded to nearest even, so that a 16-bit pool behaves as an fp32 pool
// holding the rounded values. Offsets are in elements, as KvBlockLayout's k_offset and v_offset give them.
#include <cstdint>

#include "kernels/kv_block_layout.h"

namespace strata::cpu {

// Whether a pool's full-precision blocks are fp32, which the ops may read in place.
inline bool kv_rows_are_f32(const KvPoolView& pool) { return pool.layout.dtype == DType::f32; }
// The address of element `offset` of full-precision block `block`.
inline uint8_t* kv_element(const KvPoolView& pool, int32_t block, int64_t offset) {
  return static_cast<uint8_t*>(pool.base) + int64_t(block) * pool.layout.block_bytes() +
         offset * dtype_bytes(pool.layout.dtype);
}
// out[0, n) = elements [offset, offset + n) of block `block`, as fp32.
void read_kv_rows(const KvPoolView& pool, int32_t block, int64_t offset, int64_t n, float* out);
// Elements [offset, offset + n) of block `block` = in[0, n), rounded to the pool's element type.
void write_kv_rows(const KvPoolView& pool, int32_t block, int64_t offset, const float* in, int64_t n);
// n elements from (from_block, from) to (to_block, to), as they are stored; the ranges may overlap.
void move_kv_elements(const KvPoolView& pool, int32_t to_block, int64_t to, int32_t from_block, int64_t from,
                      int64_t n);
// Entries [0, n) of KV head `head` in block `block`, its keys or its values, as fp32: a quantized block's
// dequantized (kernels/cpu/kv_quantization.h), a full-precision block's read. Not for coded blocks.
void read_head_entries(const KvPoolView& pool, int32_t block, int head, int n, bool values, float* out);
// Throws std::invalid_argument naming `op` unless the pool's full-precision blocks are f32, f16 or bf16.
void require_kv_element_type(const KvPoolView& pool, const char* op);

}  // namespace strata::cpu
