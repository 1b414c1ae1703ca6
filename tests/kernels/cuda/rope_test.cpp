// The CUDA backend's rope (kernels/cuda/rope.cu) against its CPU twin, in both layouts and with Llama 3 scaling.
// Against the CPU rather than a double reference: the device takes the CPU's fp32 angles position * inv_freq bit
// for bit (the same host function gives the frequencies), and at positions up to 100,000 an angle in double
// differs from that fp32 product by far more than the tolerance. Both take cosines and sines from double; the
// rotation may fuse multiply-adds: 2e-6 absolute for |x| <= 1.
// Without a GPU every test skips itself with cuda_unavailable_reason().
#ifdef STRATA_HAVE_CUDA

#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/backend.h"
#include "tests/kernels/cuda/cuda_test_support.h"

namespace strata {
namespace {

using test::expect_near_all;
using test::random_values;
using CudaRope = test::CudaTest;

TEST_F(CudaRope, RopeMatchesTheCpuInBothLayoutsAndScaled) {
  const std::vector<int32_t> positions = {0, 1, 7, 100, 4095, 8191, 31999, 100000};
  const int64_t t = int64_t(positions.size());
  RopeParams scaled{RopeStyle::half_split, 500000.0f, RopeScaling{8.0f, 1.0f, 4.0f, 8192}};
  for (const RopeParams& params : {RopeParams{RopeStyle::interleaved, 10000.0f, {}},
                                   RopeParams{RopeStyle::half_split, 100000.0f, {}}, scaled}) {
    for (int head_dim : {64, 128}) {
      const int n_heads = 3;
      std::vector<float> x = random_values(size_t(t * n_heads * head_dim), rng);
      Tensor xd = device(x, t, int64_t(n_heads) * head_dim);
      gpu->rope(xd, positions, n_heads, head_dim, params);
      Tensor xc = on_cpu(x, t, int64_t(n_heads) * head_dim);
      cpu->rope(xc, positions, n_heads, head_dim, params);
      expect_near_all(host(xd), x, 2e-6f, 0.0f,
                      "rope style " + std::to_string(int(params.style)) + " theta " + std::to_string(params.theta) +
                          " factor " + std::to_string(params.scaling.factor) + " head_dim " +
                          std::to_string(head_dim));
    }
  }
}

}  // namespace
}  // namespace strata

#endif  // STRATA_HAVE_CUDA
