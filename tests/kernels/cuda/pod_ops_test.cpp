// PoD on CUDA (kernels/cuda/pod_ops.cu) against its CPU twin on random pools (tests/kernels/cuda/twin_pool.h):
// attention within bf16 rounding and fp32 reordering, pairings exactly.
// Without a GPU every test skips itself with cuda_unavailable_reason().
#ifdef STRATA_HAVE_CUDA

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/backend.h"
#include "kernels/kv_block_layout.h"
#include "kernels/pod_attention.h"
#include "tests/kernels/cuda/twin_pool.h"

namespace strata {
namespace {

using test::DeviceMatrix;
using test::TwinPool;
using CudaPod = test::CudaTest;

TEST_F(CudaPod, PodAttentionOfTwoSequencesWithAPairedBlockMatchesTheCpu) {
  constexpr int kHeads = 4, kKvHeads = 2, kDim = 64, kBlock = 16;
  const KvBlockLayout layout{kKvHeads, kDim, kBlock, DType::f32};
  TwinPool pool(layout, 24);
  for (int32_t b = 0; b < pool.n_slots; ++b) pool.fill(b, rng);
  const PodWindow window{4, 8};

  // Sequence 0 decodes 3 rows after 80 entries; its entries 32-63 (distant for every row) are a paired block:
  // block 7 holds 32-47 as itself and 48-63 in its key region, moved there from block 8.
  const std::vector<int32_t> first = {7}, second = {8};
  cpu->kv_pair_values(first, second, pool.cpu);
  gpu->kv_pair_values(first, second, pool.gpu);
  const std::vector<int32_t> own0 = {5, 6, 7, pod_paired_id(7), 9, 10};
  const std::vector<int32_t> leader0 = {11, 12, 13, 14, 15, 16};
  // Sequence 1 is a prefill chunk of 20 rows from entry 0; its leader is itself in KV head 0 and another
  // layer in KV head 1.
  const std::vector<int32_t> own1 = {17, 18};
  const std::vector<int32_t> leader1 = {19, 20};

  const int rows = 3 + 20;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto random_matrix = [&] {
    std::vector<float> m(size_t(rows * kHeads * kDim));
    for (float& x : m) x = normal(rng);
    return m;
  };
  const std::vector<float> q = random_matrix(), leader_q0 = random_matrix(), leader_q1 = random_matrix();
  DeviceMatrix q_gpu(rows, kHeads * kDim, q), leader_q0_gpu(rows, kHeads * kDim, leader_q0),
      leader_q1_gpu(rows, kHeads * kDim, leader_q1), out_gpu(rows, kHeads * kDim, std::vector<float>(q.size()));

  std::vector<AttentionSequence> seqs(2);
  seqs[0].q_begin = 0;
  seqs[0].n_q = 3;
  seqs[0].n_ctx_before = 80;
  seqs[0].block_table = own0;
  seqs[1].q_begin = 3;
  seqs[1].n_q = 20;
  seqs[1].n_ctx_before = 0;
  seqs[1].block_table = own1;
  // Where sequence 1 is its own leader (KV head 0), its distant queries are q itself.
  auto distant = [&](const float* own_q, const float* query0, const float* query1) {
    std::vector<PodDistant> d(2);
    d[0].key_tables = {leader0, leader0};
    d[0].queries = {query0, query1};
    d[1].key_tables = {own1, leader1};
    d[1].queries = {own_q, query1};
    return d;
  };
  std::vector<float> q_host = q, out_host(q.size());
  const std::vector<PodDistant> cpu_distant = distant(q_host.data(), leader_q0.data(), leader_q1.data());
  auto device_floats = [](const DeviceMatrix& m) { return static_cast<const float*>(m.tensor.data); };
  const std::vector<PodDistant> gpu_distant =
      distant(device_floats(q_gpu), device_floats(leader_q0_gpu), device_floats(leader_q1_gpu));

  Tensor q_cpu{q_host.data(), DType::f32, rows, kHeads * kDim};
  Tensor out_cpu{out_host.data(), DType::f32, rows, kHeads * kDim};
  const float scale = 1.0f / std::sqrt(float(kDim));
  cpu->pod_attention(q_cpu, seqs, cpu_distant, pool.cpu, kHeads, scale, window, out_cpu);
  gpu->pod_attention(q_gpu.tensor, seqs, gpu_distant, pool.gpu, kHeads, scale, window, out_gpu.tensor);
  const std::vector<float> out = out_gpu.read();
  int far = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    far += std::fabs(out[i] - out_host[i]) > 2e-4 + 1e-3 * std::fabs(out_host[i]);
  }
  EXPECT_EQ(far, 0);
}

TEST_F(CudaPod, PairingValuesCopiesTheValueRegionExactly) {
  const KvBlockLayout layout{2, 64, 16, DType::f32};
  TwinPool pool(layout, 6);
  for (int32_t b = 0; b < pool.n_slots; ++b) pool.fill(b, rng);
  const std::vector<int32_t> first = {0, 3}, second = {5, 1};
  cpu->kv_pair_values(first, second, pool.cpu);
  gpu->kv_pair_values(first, second, pool.gpu);
  expect_same_full_pool(pool);
}

}  // namespace
}  // namespace strata

#endif  // STRATA_HAVE_CUDA
