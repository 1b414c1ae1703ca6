#pragma once
// The CUDA twins of the KV-cache ops of Backend (kernels/backend.h is the contract; kernels/cpu/ the reference):
// compaction, KIVI quantization, D2O's nearest keys and merges, PoD attention and value pairing, SpindleKV's
// codebooks. Each function takes the backend's CudaContext and then exactly the Backend method's parameters.
//
// CUDA facts (kernels/kv_block_layout.h): full-precision blocks are bf16, quantized blocks have the CPU's byte
// layout (codes, fp32 scales and mins). Block tables, kept lists, merges and encodings are host data, uploaded
// through the context; host outputs are downloaded before the function returns. Kernels run on ctx.stream().
//
// SpindleKV's codebook ops read entries from bf16 blocks and keep codebook vectors in fp32 (as in an f32 pool).
// On the same numbers they give the CPU's results bit for bit: the build's assignment and centres, the match's
// cosines and indices, the encode's code rows and vectors; write-backs are the CPU's values rounded to bf16.
//
// Files: cuda_kv_compaction.cu, cuda_kv_quantization.cu, cuda_kv_merge.cu, cuda_kv_pod.cu, cuda_kv_codebook.cu;
// what they share is cuda_kv_device.cuh.
#include <cstdint>
#include <span>

#include "kernels/backend.h"

namespace strata::cuda {

class CudaContext;

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
