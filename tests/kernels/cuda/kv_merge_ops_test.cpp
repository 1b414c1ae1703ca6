// D2O's cache ops on CUDA (kernels/cuda/kv_merge_ops.cu) against their CPU twins on random pools
// (tests/kernels/cuda/twin_pool.h): nearest keys within 1e-3, and the same candidate wherever the best one is
// clearly ahead; merges within bf16 rounding and fp32 reordering.
// Without a GPU every test skips itself with cuda_unavailable_reason().
#ifdef STRATA_HAVE_CUDA

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/backend.h"
#include "kernels/kv_block_layout.h"
#include "kernels/kv_merge.h"
#include "tests/kernels/cuda/twin_pool.h"

namespace strata {
namespace {

using test::DevicePoolCopy;
using test::PoolReader;
using test::TwinPool;
using test::within_code_steps;
using CudaKvMerge = test::CudaTest;

TEST_F(CudaKvMerge, NearestKeysMatchTheCpu) {
  const KvBlockLayout layout{2, 64, 16, DType::f32};
  TwinPool pool(layout, 6);
  for (int32_t b = 0; b < pool.n_slots; ++b) pool.fill(b, rng);
  const std::vector<int32_t> table = {4, 2, 0, 5};  // 64 entries
  std::vector<int32_t> queries, candidates;
  for (int e = 0; e < 64; ++e) (e % 3 == 0 ? queries : candidates).push_back(e);
  for (int head : {0, 1}) {
    std::vector<float> cpu_similarity(queries.size()), gpu_similarity(queries.size());
    std::vector<int32_t> cpu_candidate(queries.size()), gpu_candidate(queries.size());
    cpu->kv_nearest_keys(table, head, queries, candidates, pool.cpu, cpu_similarity, cpu_candidate);
    gpu->kv_nearest_keys(table, head, queries, candidates, pool.gpu, gpu_similarity, gpu_candidate);
    // The runner-up, computed here in double, says where the choice is clear.
    const PoolReader host{pool.cpu};
    auto key = [&](int e, int c) { return double(host.at(table[size_t(e / 16)], true, head, e % 16, c)); };
    for (size_t i = 0; i < queries.size(); ++i) {
      std::vector<double> cosines;
      for (int32_t cand : candidates) {
        double dot = 0, qq = 0, kk = 0;
        for (int c = 0; c < 64; ++c) {
          dot += key(queries[i], c) * key(cand, c);
          qq += key(queries[i], c) * key(queries[i], c);
          kk += key(cand, c) * key(cand, c);
        }
        cosines.push_back(dot / (std::sqrt(qq) * std::sqrt(kk)));
      }
      std::sort(cosines.rbegin(), cosines.rend());
      EXPECT_NEAR(gpu_similarity[i], cpu_similarity[i], 1e-3) << "query " << queries[i];
      if (cosines[0] - cosines[1] > 1e-3) {
        EXPECT_EQ(gpu_candidate[i], cpu_candidate[i]) << "query " << queries[i];
      }
    }
  }
}

// A query whose every cosine is NaN (a NaN key) has no nearest candidate: both answer -inf at candidate 0.
TEST_F(CudaKvMerge, NearestKeysOfANanKeyAreCandidateZeroOnBoth) {
  const KvBlockLayout layout{2, 64, 16, DType::f32};
  TwinPool pool(layout, 2);
  pool.fill(0, rng);
  pool.fill_nan(1);
  const std::vector<int32_t> table = {0, 1}, queries = {16, 20}, candidates = {1, 2, 3};
  std::vector<float> cpu_similarity(2), gpu_similarity(2);
  std::vector<int32_t> cpu_candidate(2, -7), gpu_candidate(2, -7);
  cpu->kv_nearest_keys(table, 1, queries, candidates, pool.cpu, cpu_similarity, cpu_candidate);
  gpu->kv_nearest_keys(table, 1, queries, candidates, pool.gpu, gpu_similarity, gpu_candidate);
  EXPECT_EQ(cpu_candidate, (std::vector<int32_t>{0, 0}));
  EXPECT_EQ(gpu_candidate, cpu_candidate);
  EXPECT_EQ(gpu_similarity, (std::vector<float>{-INFINITY, -INFINITY}));
  EXPECT_EQ(cpu_similarity, gpu_similarity);
}

TEST_F(CudaKvMerge, MergesWithSeveralSourcesPerTargetMatchTheCpu) {
  const KvBlockLayout layout{2, 64, 16, DType::f32};
  TwinPool pool(layout, 5);
  for (int32_t b = 0; b < pool.n_slots; ++b) pool.fill(b, rng);
  const std::vector<int32_t> table = {3, 0, 4};  // 48 entries
  KvMerges merges;
  merges.add(2, 0.5f, {20, 21, 40}, {0.2f, 0.2f, 0.1f});
  merges.add(17, 0.25f, {33}, {0.75f});
  merges.add(30, 1.0f, {}, {});
  merges.add(47, 0.4f, {5, 6, 7, 8}, {0.15f, 0.15f, 0.15f, 0.15f});
  for (int head : {1, 0}) {
    cpu->kv_merge(table, merges, pool.cpu, head);
    gpu->kv_merge(table, merges, pool.gpu, head);
  }
  const DevicePoolCopy copy(pool);
  const PoolReader& device = copy.reader;
  const PoolReader host{pool.cpu};
  int far = 0;
  for (int32_t b = 0; b < pool.n_slots; ++b) {
    for (int h = 0; h < 2; ++h) {
      for (int s = 0; s < 16; ++s) {
        for (int c = 0; c < 64; ++c) {
          // Merged entries were rounded to bf16 once on the device (and its inputs after the first merge).
          for (bool key : {true, false}) {
            far += !within_code_steps(device.at(b, key, h, s, c), host.at(b, key, h, s, c), 0.0f);
          }
        }
      }
    }
  }
  EXPECT_EQ(far, 0);
}

}  // namespace
}  // namespace strata

#endif  // STRATA_HAVE_CUDA
