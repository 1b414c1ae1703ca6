#pragma once
// out = x * w^T for a weight the CPU backend holds quantized (kernels/cpu/packed_weight.h), x fp32.
// Few rows (decode, batched decode): the fused kernels (kernels/cpu/quantized_dot.h) dequantize each weight row in
// registers and multiply it with every row of x, reading the weight once. Many rows (prefill): tiles of the weight
// are dequantized to fp32 in memory and multiplied with BLAS, which is faster there (docs/decisions.md); but the
// 16-row tiles with integer activations take their integer kernel at every row count, faster than BLAS throughout.
// Threads: the weight's rows are split into chunks that the compute pool's threads claim.
// With ActivationDtype::int8 or int16 (engine.activation_dtype) x is first rounded to integers per block of 32
// (kernels/cpu/integer_activations.h) and every path multiplies the rounded values: the 16-row tiles, and the pair
// layouts with int8, in integer arithmetic; the pairs with int16, the k-quant layouts' fused kernels and the fp32
// tiles in fp32 on d * q. So a row's result does not depend on the path beyond the order of sums, as with fp32
// activations. The f16 and bf16 layouts (is_half) multiply x itself on every path, as fp32 weights do.
#include <cstdint>
#include <span>

#include "kernels/backend.h"
#include "kernels/cpu/integer_activations.h"
#include "kernels/cpu/packed_weight.h"
#include "kernels/cpu/quantized_dot.h"

namespace strata::cpu {

// Rows of x from which the fp32 tiles are used instead of the fused kernels (not for 16-row tiles with integers).
constexpr int64_t kDequantizedTileMinRows = 32;

// x [n_rows, w.cols], out [n_rows, w.rows]. `isa` picks the fused kernels (tests run each level).
void quantized_matmul(const float* x, int64_t n_rows, const PackedWeight& w, float* out,
                      ActivationDtype activations = ActivationDtype::f32, CpuIsa isa = best_cpu_isa());
// The same through the fused kernels whatever the row count (tests; the comparison of the two paths).
void quantized_matmul_fused(const float* x, int64_t n_rows, const PackedWeight& w, float* out, CpuIsa isa);
// The fused kernels on activations rounded to integers (x_hat: the values they stand for, which the layouts without
// an integer kernel for x's digits multiply in fp32), whatever the row count.
void quantized_matmul_integer(const IntegerActivations& x, const float* x_hat, const PackedWeight& w, float* out,
                           CpuIsa isa);
// out[i] = x * w[i]^T for several weights of x's width: with few rows, one parallel loop over all their rows;
// otherwise quantized_matmul for each.
void quantized_matmul_shared_input(const float* x, int64_t n_rows, std::span<const PackedWeight* const> w,
                                   std::span<float* const> out, ActivationDtype activations = ActivationDtype::f32,
                                   CpuIsa isa = best_cpu_isa());
// The same through dequantized fp32 tiles and BLAS whatever the row count.
void quantized_matmul_tiles(const float* x, int64_t n_rows, const PackedWeight& w, float* out);

// out[t] = row ids[t] of `table`, dequantized.                       out [ids.size(), table.cols]
void quantized_embedding(const int32_t* ids, int64_t n_ids, const PackedWeight& table, float* out);

}  // namespace strata::cpu
