#pragma once
// GGML tensor types: ids as written in GGUF files, block sizes, and dequantization to fp32
// (../shared/specs/model_format.md, section 2).
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "kernels/weight_format.h"  // fp16_to_fp32, bf16_to_fp32, and the formats the kernels compute with

namespace strata {

enum class GgmlType : uint32_t {
  f32 = 0, f16 = 1, q4_0 = 2, q4_1 = 3, q5_0 = 6, q5_1 = 7, q8_0 = 8, q8_1 = 9,
  q2_k = 10, q3_k = 11, q4_k = 12, q5_k = 13, q6_k = 14, q8_k = 15, bf16 = 30,
};

// The kernels' format that holds a GGML type as it is (f32, q8_0, q4_0, q4_1, q4_k, q5_k, q6_k); none for the others.
std::optional<WeightFormat> weight_format_of(GgmlType type);

struct GgmlTypeTraits {
  std::string_view name;
  int64_t block_elements;  // values per block
  int64_t block_bytes;     // bytes per block
  bool supported;          // dequantize_row can read it
};

// nullptr when the id is unknown to this build.
const GgmlTypeTraits* ggml_type_traits(uint32_t type_id);
std::string_view ggml_type_name(GgmlType type);

// Bytes taken by n_elements values of `type` (n_elements must be a multiple of the block size).
uint64_t ggml_row_bytes(GgmlType type, int64_t n_elements);

// Dequantizes n_elements values (a multiple of the block size) from `src` into `dst`.
// Throws std::invalid_argument for a type without dequantization support.
void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n_elements);

// n_blocks Q5_0 blocks (x = d * (q - 16), q 5 bits) rewritten as Q8_0 blocks of the same values: d kept, each code
// q - 16 as an int8. Exact, unlike a requantization, which would rescale each block to the int8 range.
void q5_0_as_q8_0(const uint8_t* src, uint8_t* dst, int64_t n_blocks);

}  // namespace strata
