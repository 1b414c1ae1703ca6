#pragma once
// The CUDA twins of Backend's ops (kernels/backend.h is the contract; kernels/cpu/ the reference), each a free
// function that takes the backend's CudaContext and then exactly the Backend method's parameters. Each checks its
// shapes on the host (std::invalid_argument naming the op), then queues its kernels on ctx.stream(); none of them
// waits for the device but those with host outputs (sample_rows, the KV searches, key forms and codebook ops),
// which download them before returning. The caller (CudaBackend) starts each op with ctx.begin_op().
//
// Storage: activations are f32, weights bf16 (upload_weight). KV blocks (kernels/kv_block_layout.h): full-precision
// blocks are bf16, quantized blocks have the CPU's byte layout (codes, fp16 scales and mins). Block tables, kept
// lists, merges and encodings are host data, uploaded through the context.
//
// SpindleKV's codebook ops read entries from bf16 blocks and keep codebook vectors in fp32 (as in an f32 pool).
// On the same numbers they give the CPU's results bit for bit: the build's assignment and centres, the match's
// cosines and indices, the encode's code rows and vectors; write-backs are the CPU's values rounded to bf16.
//
// Each op is in the file named like its CPU twin in kernels/cpu/: elementwise.cu (embedding, rmsnorm, silu_mul,
// add, gather_rows, the f32 -> bf16 cast), token_sampling.cu (sample_rows), matmul.cu (cuBLAS; gemv.cu for one
// row of x), rope.cu,
// paged_attention.cu (kv_write, paged attention, column sums), kv_compaction.cu, kv_quantization.cu,
// kv_merge_ops.cu, kv_key_forms.cu, pod_ops.cu, kv_codebook.cu; what the KV ops share is kv_device.cuh.
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

// The rule of kernels/token_sampling.h on each row of logits [rows.size(), V], masks and penalties applied in place;
// waits for the device, to bring the tokens and logprobs to `out`.
void sample_rows(CudaContext& ctx, Tensor& logits, std::span<const RowSampling> rows, std::span<RowSample> out);

void matmul(CudaContext& ctx, const Tensor& x, const Tensor& w, Tensor& out);
void matmul_shared_input(CudaContext& ctx, const Tensor& x, std::span<const Tensor* const> w,
                         std::span<Tensor* const> out);
// matmul's path for one row of x (gemv.cu), 1 to 3 weights with 8k inputs, 16-byte aligned: false (and nothing
// queued) when the product is not of that kind. Shapes checked by the caller.
bool gemv(CudaContext& ctx, const Tensor& x, std::span<const Tensor* const> w, std::span<Tensor* const> out);

void rope(CudaContext& ctx, Tensor& x, std::span<const int32_t> positions, int n_heads, int head_dim,
          const RopeParams& params);

void kv_write(CudaContext& ctx, const Tensor& k, const Tensor& v, std::span<const AttentionSequence> seqs,
              const KvPoolView& pool);
void paged_attention(CudaContext& ctx, const Tensor& q, std::span<const AttentionSequence> seqs,
                     const KvPoolView& pool, int n_heads, float scale, Tensor& out);

// The KV-cache ops.
void kv_compact(CudaContext& ctx, std::span<const int32_t> block_table, std::span<const int32_t> kept,
                const KvPoolView& pool, int head);
void kv_quantize(CudaContext& ctx, std::span<const int32_t> src, std::span<const int32_t> dst,
                 const KvPoolView& pool);
void kv_dequantize(CudaContext& ctx, std::span<const int32_t> src, std::span<const int32_t> dst,
                   const KvPoolView& pool);

void kv_nearest_keys(CudaContext& ctx, std::span<const int32_t> block_table, int head,
                     std::span<const int32_t> queries, std::span<const int32_t> candidates, const KvPoolView& pool,
                     std::span<float> best_similarity, std::span<int32_t> best_candidate);
void kv_merge(CudaContext& ctx, std::span<const int32_t> block_table, const KvMerges& merges, const KvPoolView& pool,
              int head);
void kv_key_forms(CudaContext& ctx, std::span<const int32_t> block_table, int head, std::span<const float> linear,
                  std::span<const float> quadratic, const KvPoolView& pool, std::span<float> forms,
                  std::span<float> value_norms);

int kv_codebook_build(CudaContext& ctx, std::span<const int32_t> block_table, int head, KvPart part,
                      std::span<const int32_t> positions, float threshold, const KvPoolView& pool,
                      std::span<int32_t> assignment, std::span<int32_t> centres);
void kv_codebook_match(CudaContext& ctx, std::span<const int32_t> block_table, int head, KvPart part,
                       std::span<const int32_t> entries, std::span<const int32_t> positions,
                       std::span<const int32_t> codebook, const KvPoolView& pool, std::span<float> best_similarity,
                       std::span<int32_t> best_index);
void kv_codebook_encode(CudaContext& ctx, std::span<const int32_t> block_table, const KvCodebookEncoding& encoding,
                        const KvPoolView& pool);

void pod_attention(CudaContext& ctx, const Tensor& q, std::span<const AttentionSequence> seqs,
                   std::span<const PodDistant> distant, const KvPoolView& pool, int n_heads, float scale,
                   const PodWindow& window, Tensor& out);
void kv_pair_values(CudaContext& ctx, std::span<const int32_t> first, std::span<const int32_t> second,
                    const KvPoolView& pool);

}  // namespace strata::cuda
