// GEMM of the CPU reference backend: out = x * w^T with w stored [out, in] (the layout of both GGUF and Hugging
// Face linear weights).
//
// Threading: the output columns are split across the compute pool's threads (kernels/cpu/thread_pool.h) and each
// slice is one single-threaded BLAS call. Letting OpenBLAS run its own thread pool beside ours puts two sets of
// spinning threads on the same cores; on a busy 2-core machine that made decoding 8x slower (measured: 1.3 vs 9.9
// tokens/s).
#include <cblas.h>

#include <algorithm>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/thread_pool.h"

extern "C" void openblas_set_num_threads(int num_threads);

namespace strata::cpu {

void sgemm_nt(const float* x, const float* w, int64_t m, int64_t n, int64_t k, float* out, int64_t ldo) {
  // OpenBLAS keeps one thread per call from the first call on; the parallelism is ours.
  static const bool single_threaded = [] {
    openblas_set_num_threads(1);
    return true;
  }();
  (void)single_threaded;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(m), int(n), int(k), 1.0f, x, int(k), w, int(k), 0.0f, out,
              int(ldo));
}

void matmul(const float* x, const float* w, int64_t n_rows, int64_t n_in, int64_t n_out, float* out) {
  if (n_rows == 0) return;
  const int n_threads = compute_pool().size();
  // Slices of at least 64 output columns (a multiple of 16), so small matrices stay in one call.
  const int64_t slice = std::max<int64_t>(64, ((n_out + n_threads - 1) / n_threads + 15) / 16 * 16);
  parallel_for(n_out, slice, [&](int64_t begin, int64_t end) {
    sgemm_nt(x, w + begin * n_in, n_rows, end - begin, n_in, out + begin, n_out);
  });
}

}  // namespace strata::cpu
