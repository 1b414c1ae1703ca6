#include "kernels/cpu/kv_rows.h"

#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/cpu/kv_quantization.h"
#include "kernels/weight_format.h"

namespace strata::cpu {
namespace {

// The weight format of the same 16-bit type, whose widening and rounding (kernels/weight_format.h) the pool shares.
WeightFormat half_format(DType dtype) { return dtype == DType::bf16 ? WeightFormat::bf16 : WeightFormat::f16; }

}  // namespace

void read_kv_rows(const KvPoolView& pool, int32_t block, int64_t offset, int64_t n, float* out) {
  const uint8_t* from = kv_element(pool, block, offset);
  if (kv_rows_are_f32(pool)) {
    std::memcpy(out, from, size_t(n) * sizeof(float));
  } else {
    dequantize_weight_row(half_format(pool.layout.dtype), from, out, n);
  }
}

void write_kv_rows(const KvPoolView& pool, int32_t block, int64_t offset, const float* in, int64_t n) {
  uint8_t* to = kv_element(pool, block, offset);
  if (kv_rows_are_f32(pool)) {
    std::memcpy(to, in, size_t(n) * sizeof(float));
  } else {
    round_row_to_half(half_format(pool.layout.dtype), in, to, n);
  }
}

void move_kv_elements(const KvPoolView& pool, int32_t to_block, int64_t to, int32_t from_block, int64_t from,
                      int64_t n) {
  std::memmove(kv_element(pool, to_block, to), kv_element(pool, from_block, from),
               size_t(n) * size_t(dtype_bytes(pool.layout.dtype)));
}

void read_head_entries(const KvPoolView& pool, int32_t block, int head, int n, bool values, float* out) {
  const KvBlockLayout& L = pool.layout;
  if (pool.is_quantized(block)) {
    (values ? dequantize_values : dequantize_keys)(pool.block_quantized(block), head, 0, n, L, out);
  } else {
    read_kv_rows(pool, block, values ? L.v_offset(head, 0) : L.k_offset(head, 0), int64_t(n) * L.head_dim, out);
  }
}

void require_kv_element_type(const KvPoolView& pool, const char* op) {
  const DType d = pool.layout.dtype;
  if (d != DType::f32 && d != DType::f16 && d != DType::bf16) {
    throw std::invalid_argument(std::string(op) + ": the CPU pool's blocks must be f32, f16 or bf16");
  }
}

}  // namespace strata::cpu
