#pragma once
// The CPU reference of Backend::kv_key_forms: Expected Attention's quadratic forms of a KV head's keys and the
// norms of its values, over full-precision and quantized blocks.
#include <cstdint>
#include <span>

#include "kernels/kv_block_layout.h"

namespace strata::cpu {

void kv_key_forms(std::span<const int32_t> block_table, int head, std::span<const float> linear,
                  std::span<const float> quadratic, const KvPoolView& pool, std::span<float> forms,
                  std::span<float> value_norms);

}  // namespace strata::cpu
