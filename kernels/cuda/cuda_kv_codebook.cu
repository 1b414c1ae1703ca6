// SpindleKV's codebook ops on CUDA: not provided. Coded blocks and codebook vectors are defined over an f32 pool
// (kernels/kv_block_layout.h: a codebook vector is head_dim floats at a float offset of the pool), while the CUDA
// pool is bf16, and the CUDA paged attention does not read coded blocks. SpindleKV needs the CPU backend; these
// functions say so, so that a misconfiguration fails at its first use instead of corrupting the pool.
#include <stdexcept>

#include "kernels/cuda/cuda_kv_ops.h"

namespace strata::cuda {
namespace {

[[noreturn]] void needs_cpu_backend() {
  throw std::invalid_argument("cuda backend: SpindleKV's codebooks need the CPU backend (an f32 pool)");
}

}  // namespace

int kv_codebook_build(CudaContext&, std::span<const int32_t>, int, KvPart, std::span<const int32_t>, float,
                      const KvPoolView&, std::span<int32_t>, std::span<int32_t>) {
  needs_cpu_backend();
}

void kv_codebook_match(CudaContext&, std::span<const int32_t>, int, KvPart, std::span<const int32_t>,
                       std::span<const int32_t>, std::span<const int32_t>, const KvPoolView&, std::span<float>,
                       std::span<int32_t>) {
  needs_cpu_backend();
}

void kv_codebook_encode(CudaContext&, std::span<const int32_t>, const KvCodebookEncoding&, const KvPoolView&) {
  needs_cpu_backend();
}

}  // namespace strata::cuda
