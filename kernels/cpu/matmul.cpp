// GEMM of the CPU reference backend: BLAS sgemm, out = x * w^T with w stored [out, in] (the layout of both GGUF
// and Hugging Face linear weights).
#include <cblas.h>

#include "kernels/cpu/cpu_ops.h"

namespace strata::cpu {

void matmul(const float* x, const float* w, int64_t n_rows, int64_t n_in, int64_t n_out, float* out) {
  if (n_rows == 0) return;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(n_rows), int(n_out), int(n_in), 1.0f, x, int(n_in), w,
              int(n_in), 0.0f, out, int(n_out));
}

}  // namespace strata::cpu
