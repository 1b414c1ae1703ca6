#pragma once
// KIVI group quantization on the CPU (kernels/kv_block_layout.h has the block format): the primitives that the
// seal (kv_quantize), kv_dequantize, the compaction of quantized layers and paged attention share. Each works on
// one KV head of one quantized block.
#include <cstdint>

#include "kernels/kv_block_layout.h"
#include "kernels/weight_format.h"

namespace strata::cpu {

// Asymmetric round-to-nearest over one group: scale = (max - min) / levels and min, each rounded to fp16 as stored
// (kernels/kv_block_layout.h), then code = round((x - min) / scale) with the rounded pair (ties to even, as
// torch.round), so |x - (min + code * scale)| <= scale / 2 but for fp16's rounding of the two (2^-11 of the
// group's range and of its min). A constant group has scale 0 and every code 0: it comes back as its min.
struct QuantGroup {
  float scale = 0.0f;
  float min = 0.0f;
};
QuantGroup fit_group(const float* x, int n, int64_t stride, int levels);
int quantize_value(float x, const QuantGroup& g, int levels);

// A scale or min as stored: fp16, saturated at +-kKvScaleMax (NaN stays NaN); and back.
uint16_t store_scale(float x);
inline float load_scale(uint16_t stored) { return fp16_to_fp32(stored); }

// Keys of one head: the block's 32 entries, entry t at k + t * stride, quantized per channel.
void quantize_keys(const float* k, int64_t stride, uint8_t* block, int head, const KvBlockLayout& L);
// One entry's value vector (head_dim floats), quantized per group of 32 channels into entry `slot`.
void quantize_value_row(const float* v, uint8_t* block, int head, int slot, const KvBlockLayout& L);
// Entries [first, first + n) of one head, dequantized into n rows of head_dim floats at out: min + code * scale,
// as kv_dequantize writes them (attention reads a quantized block this way).
void dequantize_keys(const uint8_t* block, int head, int first, int n, const KvBlockLayout& L, float* out);
void dequantize_values(const uint8_t* block, int head, int first, int n, const KvBlockLayout& L, float* out);
// The same for x86-64-v3 (kv_dequantize_avx2.cpp): dequantize_keys and dequantize_values take them where
// best_cpu_isa() allows AVX2.
void dequantize_keys_avx2(const uint8_t* block, int head, int first, int n, const KvBlockLayout& L, float* out);
void dequantize_values_avx2(const uint8_t* block, int head, int first, int n, const KvBlockLayout& L, float* out);

// A value entry with its codes and per-token scales, as stored (values move without requantization).
void copy_value_entry(const uint8_t* src_block, int src_slot, uint8_t* dst_block, int dst_slot, int head,
                      const KvBlockLayout& L);

}  // namespace strata::cpu
