#pragma once
// The products behind the CPU backend's quantized matmul: rows of a packed weight (kernels/cpu/packed_weight.h)
// against fp32 activation rows, the weights dequantized in registers as they are read. One implementation per
// x86-64 level, all in one binary; the best the machine has is used, and the tests run every one the machine can
// (tests/kernels/quantized_matmul_test.cpp):
//   amx       avx512_vnni's kernels, and for prefill chunks and batched decode an integer kernel with AMX tile
//             products (kernels/cpu/quantized_dot_amx.cpp) on the 16-row tiles: Intel from Sapphire Rapids, where
//             Linux grants the tiles and a probe product runs (kernels/cpu/amx_probe.h);
//   avx512_vnni  avx512's fp32 kernels, and an int8 kernel of its own (kernels/cpu/quantized_dot_avx512_vnni.cpp)
//             on the 16-row tiles the CPU backend packs for it, 4 values of 16 rows per vpdpbusd: Intel from
//             Cascade Lake, AMD from Zen 4;
//   avx512    hand-written (kernels/cpu/quantized_dot_avx512.cpp);
//   avx2      hand-written, the same scheme at 256 bits (kernels/cpu/quantized_dot_avx2.cpp): x86-64-v3, for
//             the machines without AVX-512 (the portable C++ compiled for x86-64-v3, used before, decoded
//             SmolLM2 at batch 1 at a third of its speed on an AVX2-only EPYC:
//             bench/results/cpu-avx2-quantized-dot-before-after.json), and an integer kernel on the 16-row tiles
//             but Q8_0's, 4 values of 8 rows per vpmaddubsw (kernels/cpu/quantized_dot_avx2_tiles.cpp);
//   baseline  portable C++ (kernels/cpu/quantized_dot_portable.cpp) for baseline x86-64 (SSE2), and the only one
//             on other architectures.
// Activations are fp32, or rounded to integers (engine.activation_dtype: int16 by default from avx2 up, f32 at
// baseline) for kernels of their own below, beside each level's fp32 ones: int8 (as llama.cpp has) changes
// SmolLM2's top-1 token at about 3% of the reference positions, int16 as two int8 digits keeps it
// (docs/decisions.md, [cpu-speed] and [cpu-xeon]). Why not target_clones as the attention has: the AVX-512 and
// AVX2 code is intrinsics, which need a body per target, and the tests must be able to call each level by name.
#include <cstdint>
#include <string_view>

#include "kernels/cpu/packed_weight.h"

// The x86-64 levels need GNU C++'s target attributes and pragmas.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define STRATA_QUANTIZED_DOT_X86 1
#else
#define STRATA_QUANTIZED_DOT_X86 0
#endif

namespace strata::cpu {

enum class CpuIsa : uint8_t { baseline, avx2, avx512, avx512_vnni, amx };
// Every level, from the least.
inline constexpr CpuIsa kCpuIsas[] = {CpuIsa::baseline, CpuIsa::avx2, CpuIsa::avx512, CpuIsa::avx512_vnni, CpuIsa::amx};

// out[a * out_stride + i] = dot(weight row i, x row a) for weight rows i in [row_begin, row_end) and the n_x rows
// of x (w.cols floats each). The weight's layout is any but f32.
using QuantizedDotFn = void (*)(const PackedWeight& w, int64_t row_begin, int64_t row_end, const float* x,
                                int64_t n_x, float* out, int64_t out_stride);

// Whether this machine can run `isa`, and its best: the best it supports, or less where limit_cpu_isa asked
// (engine.cpu_kernels: an operator's choice, and how a machine measures the levels below its own).
bool cpu_supports(CpuIsa isa);
CpuIsa best_cpu_isa();
void limit_cpu_isa(CpuIsa most);
std::string_view cpu_isa_name(CpuIsa isa);
// The level of that name (baseline, avx2, avx512, avx512_vnni, amx); false if none.
bool cpu_isa_from_name(std::string_view name, CpuIsa& isa);

// The kernel of `isa` (which the machine must support); nullptr where this build has none (avx512 and avx2 off
// x86-64).
QuantizedDotFn quantized_dot(CpuIsa isa);

#if STRATA_QUANTIZED_DOT_X86
void quantized_dot_avx512(const PackedWeight& w, int64_t row_begin, int64_t row_end, const float* x, int64_t n_x,
                          float* out, int64_t out_stride);
void quantized_dot_avx2(const PackedWeight& w, int64_t row_begin, int64_t row_end, const float* x, int64_t n_x,
                        float* out, int64_t out_stride);
#endif
void quantized_dot_baseline(const PackedWeight& w, int64_t row_begin, int64_t row_end, const float* x, int64_t n_x,
                            float* out, int64_t out_stride);

struct IntegerActivations;  // kernels/cpu/integer_activations.h

// The integer kernels, for engine.activation_dtype int8 and int16: rows [row_begin, row_end) of a pair-layout
// weight (u4_pairs, u8_pairs: Q4_0, Q4_1, Q8_0) or of a 16-row tile layout (u4_rows16, u8_rows16, k4_rows16,
// k5_rows16, k6_rows16; row_begin and row_end multiples of 16) against every row of x rounded per block of 32 to
// one digit (int8) or two (int16), in the avx512_vnni kernel, the avx2 one (u8_rows16 aside: the CPU backend keeps
// Q8_0 in pairs there) and the baseline one, their reference. The k-quant layouts used in place have none:
// quantized_matmul multiplies those with the rounded values in fp32.
// out[a * out_stride + i].
using QuantizedDotInt8Fn = void (*)(const PackedWeight& w, int64_t row_begin, int64_t row_end,
                                    const IntegerActivations& x, float* out, int64_t out_stride);
// The int8 kernel of `isa` (which the machine must support); an AVX-512 machine without VNNI runs the AVX2 one.
QuantizedDotInt8Fn quantized_dot_int8(CpuIsa isa);
// Rows of x from which the amx level's kernel multiplies with tiles (fewer go to the VNNI kernel): where it became
// the faster on SmolLM2's ffn_up, one thread (at 12 rows with two digits, at 16 with one; docs/decisions.md).
constexpr int64_t kAmxMinRows = 16;
#if STRATA_QUANTIZED_DOT_X86
// With AMX: u4_rows16, u8_rows16, k4_rows16 and k5_rows16 from kAmxMinRows rows of x; the rest the VNNI kernel's.
void quantized_dot_int8_amx(const PackedWeight& w, int64_t row_begin, int64_t row_end, const IntegerActivations& x,
                            float* out, int64_t out_stride);
void quantized_dot_int8_avx512_vnni(const PackedWeight& w, int64_t row_begin, int64_t row_end,
                                    const IntegerActivations& x, float* out, int64_t out_stride);
void quantized_dot_int8_avx2(const PackedWeight& w, int64_t row_begin, int64_t row_end, const IntegerActivations& x,
                             float* out, int64_t out_stride);
// Its 16-row tiles (kernels/cpu/quantized_dot_avx2_tiles.cpp).
void quantized_dot_rows16_avx2(const PackedWeight& w, int64_t row_begin, int64_t row_end, const IntegerActivations& x,
                               float* out, int64_t out_stride);
#endif
void quantized_dot_int8_baseline(const PackedWeight& w, int64_t row_begin, int64_t row_end,
                                 const IntegerActivations& x, float* out, int64_t out_stride);

}  // namespace strata::cpu
