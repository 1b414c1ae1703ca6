#pragma once
// The CUDA twins of the model's ops (kernels/backend.h is the contract; kernels/cpu/ the reference). Each function
// checks its shapes on the host (std::invalid_argument naming the op), then queues its kernels on ctx.stream();
// none of them waits for the device but sample_rows, whose results are host data. The caller (CudaBackend) starts
// each op with ctx.begin_op().
//
// Storage: activations are f32, weights bf16 (upload_weight), KV blocks bf16 or KIVI-quantized.
// Files: cuda_elementwise.cu (embedding, rmsnorm, silu_mul, add, gather_rows, the f32 -> bf16 cast), cuda_sampling.cu
// (sample_rows), cuda_matmul.cu (cuBLAS), cuda_rope.cu, cuda_attention.cu (kv_write, paged attention, column sums).
#include <cstdint>
#include <span>

#include "kernels/backend.h"

namespace strata::cuda {

class CudaContext;

// dst[i] = bf16(src[i]) (round to nearest even), both device memory.
void f32_to_bf16(CudaContext& ctx, const float* src, void* dst, int64_t n);

void embedding(CudaContext& ctx, std::span<const int32_t> ids, const Tensor& table, Tensor& out);
void rmsnorm(CudaContext& ctx, const Tensor& x, const Tensor& w, float eps, Tensor& out);
void silu_mul(CudaContext& ctx, const Tensor& gate, const Tensor& up, Tensor& out);
void add(CudaContext& ctx, Tensor& x, const Tensor& y);
void gather_rows(CudaContext& ctx, const Tensor& x, std::span<const int64_t> rows, Tensor& out);

// The rule of kernels/token_sampling.h on each row of logits [rows.size(), V], the penalties applied in place;
// waits for the device, to bring the tokens and logprobs to `out`.
void sample_rows(CudaContext& ctx, Tensor& logits, std::span<const RowSampling> rows, std::span<RowSample> out);

void matmul(CudaContext& ctx, const Tensor& x, const Tensor& w, Tensor& out);

void rope(CudaContext& ctx, Tensor& x, std::span<const int32_t> positions, int n_heads, int head_dim,
          const RopeParams& params);

void kv_write(CudaContext& ctx, const Tensor& k, const Tensor& v, std::span<const AttentionSequence> seqs,
              const KvPoolView& pool);
void paged_attention(CudaContext& ctx, const Tensor& q, std::span<const AttentionSequence> seqs,
                     const KvPoolView& pool, int n_heads, float scale, Tensor& out);

}  // namespace strata::cuda
