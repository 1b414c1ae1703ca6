#pragma once
// The CPU reference ops, as free functions over plain fp32 arrays. CpuBackend forwards to them; device backends
// are tested against them.
#include <cstdint>
#include <span>

#include "kernels/backend.h"

namespace strata::cpu {

void embedding(std::span<const int32_t> ids, const float* table, int64_t d, float* out);
void rmsnorm(const float* x, const float* w, int64_t n_rows, int64_t d, float eps, float* out);
void matmul(const float* x, const float* w, int64_t n_rows, int64_t n_in, int64_t n_out, float* out);
// out [m, n] (rows ldo apart) = x [m, k] * w^T with w [n, k]: one BLAS call on the calling thread.
void sgemm_nt(const float* x, const float* w, int64_t m, int64_t n, int64_t k, float* out, int64_t ldo);
void rope(float* x, std::span<const int32_t> positions, int n_heads, int head_dim, const RopeParams& params);
void silu_mul(const float* gate, const float* up, int64_t n, float* out);
void add(float* x, const float* y, int64_t n);
void kv_write(const float* k, const float* v, std::span<const AttentionSequence> seqs, const KvPoolView& pool);
void kv_compact(std::span<const int32_t> block_table, std::span<const int32_t> kept, const KvPoolView& pool,
                int head);
void paged_attention(const float* q, std::span<const AttentionSequence> seqs, const KvPoolView& pool, int n_heads,
                     float scale, float* out);
void kv_quantize(std::span<const int32_t> src, std::span<const int32_t> dst, const KvPoolView& pool);
void kv_dequantize(std::span<const int32_t> src, std::span<const int32_t> dst, const KvPoolView& pool);

// The inverse frequencies RoPE uses for a head of head_dim (head_dim / 2 values), with Llama 3 scaling applied.
void rope_inv_freq(int head_dim, const RopeParams& params, float* inv_freq);

}  // namespace strata::cpu
