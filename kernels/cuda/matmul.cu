// GEMM of the CUDA backend: out[T, out] = x[T, in] * w[out, in]^T, w in bf16, x cast to bf16 on the way in,
// accumulation and out in fp32 (cublasGemmEx, CUBLAS_COMPUTE_32F); one row of x goes to gemv.cu.
#include <cuda_bf16.h>

#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/cuda_ops.h"

namespace strata::cuda {

namespace {

void check_shapes(const Tensor& x, const Tensor& w, const Tensor& out) {
  if (w.dtype != DType::bf16) {
    throw std::invalid_argument("cuda backend: matmul: the weight must be bf16 (Backend::upload_weight)");
  }
  if (x.dtype != DType::f32 || out.dtype != DType::f32) {
    throw std::invalid_argument("cuda backend: matmul: x and out must be f32");
  }
  if (x.cols != w.cols || out.cols != w.rows || out.rows < x.rows) {
    throw std::invalid_argument("cuda backend: matmul: x [" + std::to_string(x.rows) + ", " + std::to_string(x.cols) +
                                "] * w [" + std::to_string(w.rows) + ", " + std::to_string(w.cols) +
                                "]^T does not fit out [" + std::to_string(out.rows) + ", " +
                                std::to_string(out.cols) + "]");
  }
}

// out = xb * w^T, xb: x already cast to bf16 (once for every weight that shares it).
void cublas_matmul(CudaContext& ctx, const void* xb, int64_t x_rows, const Tensor& w, Tensor& out) {
  // cuBLAS is column-major: a row-major [r, c] matrix with leading dimension c is, to cuBLAS, the column-major
  // [c, r] matrix, its transpose. So with T = x.rows, K = in, N = out:
  //   out (row-major [T, N])  is  C = out^T  (column-major [N, T], ldc = N)
  //   w   (row-major [N, K])  is  A = w^T    (column-major [K, N], lda = K)
  //   x   (row-major [T, K])  is  B = x^T    (column-major [K, T], ldb = K)
  // and out = x * w^T  <=>  out^T = w * x^T  =  op(A) * B  with op = transpose:  C[N, T] = A^T[N, K] * B[K, T].
  const int n_out = int(w.rows), n_in = int(w.cols), n_rows = int(x_rows);
  const float alpha = 1.0f, beta = 0.0f;
  check(cublasGemmEx(ctx.cublas(), CUBLAS_OP_T, CUBLAS_OP_N, n_out, n_rows, n_in, &alpha, w.data, CUDA_R_16BF, n_in,
                     xb, CUDA_R_16BF, n_in, &beta, out.data, CUDA_R_32F, n_out, CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx (matmul)");
}

}  // namespace

void matmul(CudaContext& ctx, const Tensor& x, const Tensor& w, Tensor& out) {
  const Tensor* weights[] = {&w};
  Tensor* outs[] = {&out};
  matmul_shared_input(ctx, x, weights, outs);
}

void matmul_shared_input(CudaContext& ctx, const Tensor& x, std::span<const Tensor* const> w,
                         std::span<Tensor* const> out) {
  if (w.size() != out.size()) throw std::invalid_argument("cuda backend: matmul: as many outputs as weights");
  for (size_t i = 0; i < w.size(); ++i) check_shapes(x, *w[i], *out[i]);
  if (x.rows == 0 || gemv(ctx, x, w, out)) return;
  void* xb = ctx.scratch(size_t(x.size()) * sizeof(__nv_bfloat16));
  f32_to_bf16(ctx, x.f32(), xb, x.size());
  for (size_t i = 0; i < w.size(); ++i) cublas_matmul(ctx, xb, x.rows, *w[i], *out[i]);
}

}  // namespace strata::cuda
