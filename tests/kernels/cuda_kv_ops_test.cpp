// The CUDA backend's KV-cache ops (kernels/cuda/cuda_kv_*.cu) against their CPU twins on random inputs: every
// test builds the same pool contents twice, in an f32 pool for the CPU and a bf16 pool on the device (random
// values are rounded to bf16 first, so both hold the same numbers; quantized blocks are sealed on the CPU and
// their bytes copied, the format being the same), runs the op on both backends and compares.
// Moves and pairings must match exactly; quantized values within one code step of the CPU's group; merges and
// attention within bf16 rounding and fp32 reordering; nearest keys within 1e-3, and the same candidate wherever
// the best one is clearly ahead.
// Without a GPU every test skips itself with cuda_unavailable_reason().
#ifdef STRATA_HAVE_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/kv_block_layout.h"
#include "kernels/kv_merge.h"
#include "kernels/pod_attention.h"
#include "tests/kernels/cuda_test_support.h"

namespace strata {
namespace {

using test::bf16_bits;
using test::bf16_value;
using test::cuda_ok;
using test::round_bf16;

// Device memory that the test itself fills and reads (raw bytes: bf16 blocks and quantized blocks).
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) { cuda_ok(cudaMalloc(&data_, bytes), "cudaMalloc"); }
  ~DeviceBuffer() { cudaFree(data_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* data() const { return data_; }
  // Host -> device at a byte offset; waits, so that the backend's stream (not the legacy one) sees the bytes.
  void write(size_t offset, const void* host, size_t bytes) {
    cuda_ok(cudaMemcpy(static_cast<char*>(data_) + offset, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
    cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
  // Everything, after the backend's queued work has finished.
  std::vector<uint8_t> read() const {
    cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    std::vector<uint8_t> host(bytes_);
    cuda_ok(cudaMemcpy(host.data(), data_, bytes_, cudaMemcpyDeviceToHost), "cudaMemcpy");
    return host;
  }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// An f32 matrix in device memory, as a Tensor.
struct DeviceMatrix {
  DeviceBuffer buffer;
  Tensor tensor;
  DeviceMatrix(int64_t rows, int64_t cols, const std::vector<float>& host)
      : buffer(sizeof(float) * size_t(rows * cols)), tensor{buffer.data(), DType::f32, rows, cols} {
    buffer.write(0, host.data(), sizeof(float) * host.size());
  }
  std::vector<float> read() const {
    const std::vector<uint8_t> bytes = buffer.read();
    std::vector<float> host(bytes.size() / sizeof(float));
    std::memcpy(host.data(), bytes.data(), bytes.size());
    return host;
  }
};

// The same pool twice: n_slots f32 slots on the host for the CPU backend, n_slots bf16 slots on the device.
struct TwinPool {
  KvBlockLayout cpu_layout;
  KvBlockLayout gpu_layout;
  int32_t n_slots;
  std::vector<float> cpu_memory;
  DeviceBuffer gpu_memory;
  KvPoolView cpu;
  KvPoolView gpu;

  TwinPool(KvBlockLayout layout, int32_t slots)
      : cpu_layout(with_dtype(layout, DType::f32)),
        gpu_layout(with_dtype(layout, DType::bf16)),
        n_slots(slots),
        cpu_memory(size_t(slots * cpu_layout.elements_per_block()), 0.0f),
        gpu_memory(size_t(slots * gpu_layout.block_bytes())),
        cpu{cpu_memory.data(), cpu_layout, slots, KvKeyRope{}},
        gpu{gpu_memory.data(), gpu_layout, slots, KvKeyRope{}} {
    const std::vector<uint8_t> zeros(size_t(slots * gpu_layout.block_bytes()), 0);
    gpu_memory.write(0, zeros.data(), zeros.size());
  }

  static KvBlockLayout with_dtype(KvBlockLayout layout, DType dtype) {
    layout.dtype = dtype;
    return layout;
  }

  // Full-precision slot `block` filled with the same random bf16 numbers on both sides.
  void fill(int32_t block, std::mt19937& rng) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    float* f = cpu.block_f32(block);
    std::vector<uint16_t> bits(size_t(cpu_layout.elements_per_block()));
    for (size_t i = 0; i < bits.size(); ++i) {
      bits[i] = bf16_bits(normal(rng));
      f[i] = bf16_value(bits[i]);
    }
    gpu_memory.write(size_t(block * gpu_layout.block_bytes()), bits.data(), sizeof(uint16_t) * bits.size());
  }

  // Full-precision slot `block` filled with NaN on both sides.
  void fill_nan(int32_t block) {
    std::fill_n(cpu.block_f32(block), cpu_layout.elements_per_block(), NAN);
    const std::vector<uint16_t> bits(size_t(cpu_layout.elements_per_block()), 0x7fc0);  // a quiet bf16 NaN
    gpu_memory.write(size_t(block * gpu_layout.block_bytes()), bits.data(), sizeof(uint16_t) * bits.size());
  }

  // Id q of a quantized block that lies in slot `first_slot` or later in both pools (their slots pack different
  // numbers of quantized blocks).
  int32_t quantized_id(int first_slot, int q) const {
    const int per_slot = std::max(cpu_layout.quantized_per_slot(), gpu_layout.quantized_per_slot());
    const int32_t id = n_slots + first_slot * per_slot + q;
    const int64_t last = std::max((int64_t(id) - n_slots) / cpu_layout.quantized_per_slot(),
                                  (int64_t(id) - n_slots) / gpu_layout.quantized_per_slot());
    if (last >= n_slots) throw std::logic_error("test pool too small for quantized block " + std::to_string(q));
    return id;
  }

  // Seals full slot `src` into quantized block `dst` on the CPU and gives the device the same bytes.
  void seal_on_cpu(Backend& cpu_backend, int32_t src, int32_t dst) {
    const int32_t s[] = {src}, d[] = {dst};
    cpu_backend.kv_quantize(s, d, cpu);
    const uint8_t* bytes = cpu.block_quantized(dst);
    const size_t offset = size_t(gpu.block_quantized(dst) - static_cast<uint8_t*>(gpu.base));
    gpu_memory.write(offset, bytes, size_t(cpu_layout.quantized_block_bytes()));
  }
};

// A host copy of one pool, read element by element whatever the block's format.
struct PoolReader {
  KvPoolView view;  // base: host memory holding the pool's bytes

  static int code(const uint8_t* row, int c, KvQuant quant) {
    return quant == KvQuant::int8 ? row[c] : (row[c / 2] >> (4 * (c % 2))) & 0xF;
  }
  static float f32_at(const uint8_t* p) {
    float x;
    std::memcpy(&x, p, sizeof x);
    return x;
  }
  // Channel c of the key (or value) of (head, slot) in block `id`.
  float at(int32_t id, bool key, int head, int slot, int c) const {
    const KvBlockLayout& L = view.layout;
    if (view.is_quantized(id)) {
      const uint8_t* q = view.block_quantized(id);
      const int64_t codes = key ? L.k_codes_offset(head, slot) : L.v_codes_offset(head, slot);
      const double code_value = code(q + codes, c, L.quant);
      return float(double(min(id, key, head, slot, c)) + code_value * step(id, key, head, slot, c));
    }
    const int64_t element = key ? L.k_offset(head, slot) + c : L.v_offset(head, slot) + c;
    if (L.dtype == DType::f32) return view.block_f32(id)[element];
    uint16_t bits;
    std::memcpy(&bits, static_cast<const uint8_t*>(view.base) + id * L.block_bytes() + 2 * element, sizeof bits);
    return bf16_value(bits);
  }
  // The code step (scale) of that element's group; 0 for a full-precision block.
  float step(int32_t id, bool key, int head, int slot, int c) const {
    if (!view.is_quantized(id)) return 0.0f;
    const KvBlockLayout& L = view.layout;
    const uint8_t* q = view.block_quantized(id);
    return key ? f32_at(q + L.k_scale_offset(head) + 4 * c)
               : f32_at(q + L.v_scale_offset(head, slot) + 4 * (c / kKvQuantGroup));
  }
  float min(int32_t id, bool key, int head, int slot, int c) const {
    const KvBlockLayout& L = view.layout;
    const uint8_t* q = view.block_quantized(id);
    return key ? f32_at(q + L.k_min_offset(head) + 4 * c)
               : f32_at(q + L.v_min_offset(head, slot) + 4 * (c / kKvQuantGroup));
  }
};

// |gpu - cpu| within `steps` code steps of the CPU's group plus bf16 rounding of the value.
bool close(float gpu, float cpu, float step, float steps = 1.0f) {
  return std::fabs(double(gpu) - cpu) <= double(steps) * step * 1.001 + std::fabs(double(cpu)) * 0x1p-8 + 1e-6;
}

std::vector<int32_t> random_kept(int n_entries, double keep, std::mt19937& rng) {
  std::bernoulli_distribution take(keep);
  std::vector<int32_t> kept;
  for (int e = 0; e < n_entries; ++e) {
    if (take(rng)) kept.push_back(e);
  }
  return kept;
}

class CudaKvOps : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << cuda_unavailable_reason();
    gpu = make_cuda_backend(0);
  }
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  std::unique_ptr<Backend> gpu;
  std::mt19937 rng{20261122};
};

// --- compaction of full-precision layers ---

// The device's pool downloaded, and read like the CPU's.
struct DevicePoolCopy {
  std::vector<uint8_t> bytes;
  PoolReader reader;
  explicit DevicePoolCopy(const TwinPool& pool)
      : bytes(pool.gpu_memory.read()), reader{KvPoolView{bytes.data(), pool.gpu_layout, pool.n_slots, KvKeyRope{}}} {}
  DevicePoolCopy(const DevicePoolCopy&) = delete;  // reader points into bytes
  DevicePoolCopy& operator=(const DevicePoolCopy&) = delete;
};

// Every element of every slot, read as full precision, is the same in both pools.
void expect_same_full_pool(const TwinPool& pool) {
  const DevicePoolCopy device(pool);
  const PoolReader host{pool.cpu};
  const KvBlockLayout& L = pool.cpu_layout;
  int mismatches = 0;
  for (int32_t b = 0; b < pool.n_slots; ++b) {
    for (int h = 0; h < L.n_kv_heads; ++h) {
      for (int s = 0; s < L.block_size; ++s) {
        for (int c = 0; c < L.head_dim; ++c) {
          for (bool key : {true, false}) mismatches += device.reader.at(b, key, h, s, c) != host.at(b, key, h, s, c);
        }
      }
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST_F(CudaKvOps, CompactionOfFullPrecisionLayersMovesEntriesExactly) {
  const KvBlockLayout layout{3, 64, 16, DType::f32};
  for (int head : {-1, 0, 2}) {
    TwinPool pool(layout, 8);
    for (int32_t b = 0; b < pool.n_slots; ++b) pool.fill(b, rng);
    const std::vector<int32_t> table = {5, 1, 6, 3, 0};  // 80 entries in a shuffled table
    const std::vector<int32_t> kept = random_kept(80, 0.4, rng);
    cpu->kv_compact(table, kept, pool.cpu, head);
    gpu->kv_compact(table, kept, pool.gpu, head);
    SCOPED_TRACE("head " + std::to_string(head) + ", " + std::to_string(kept.size()) + " kept");
    expect_same_full_pool(pool);
  }
}

// --- quantization ---

KvBlockLayout quantized_layout(KvQuant quant) {
  KvBlockLayout L{2, 64, kKvQuantGroup, DType::f32};
  L.quant = quant;
  return L;
}

TEST_F(CudaKvOps, QuantizeAndDequantizeMatchTheCpuWithinACodeStep) {
  for (KvQuant quant : {KvQuant::int8, KvQuant::int4}) {
    SCOPED_TRACE(quant == KvQuant::int8 ? "int8" : "int4");
    TwinPool pool(quantized_layout(quant), 24);
    for (int32_t b = 0; b < 3; ++b) pool.fill(b, rng);
    const std::vector<int32_t> src = {2, 0, 1};
    const std::vector<int32_t> dst = {pool.quantized_id(6, 0), pool.quantized_id(6, 1), pool.quantized_id(6, 2)};
    cpu->kv_quantize(src, dst, pool.cpu);
    gpu->kv_quantize(src, dst, pool.gpu);
    // Back into slots 3-5 on both sides: the CPU's values and the device's are each their own quantization.
    const std::vector<int32_t> back = {3, 4, 5};
    cpu->kv_dequantize(dst, back, pool.cpu);
    gpu->kv_dequantize(dst, back, pool.gpu);

    const DevicePoolCopy copy(pool);
    const PoolReader& device = copy.reader;
    const PoolReader host{pool.cpu};
    const KvBlockLayout& L = pool.cpu_layout;
    int far = 0, codes_far = 0;
    for (size_t i = 0; i < src.size(); ++i) {
      for (int h = 0; h < L.n_kv_heads; ++h) {
        for (int s = 0; s < L.block_size; ++s) {
          for (int c = 0; c < L.head_dim; ++c) {
            for (bool key : {true, false}) {
              const float step = host.step(dst[i], key, h, s, c);
              // The device's dequantized bf16 value against the CPU's.
              far += !close(device.at(back[i], key, h, s, c), host.at(back[i], key, h, s, c), step);
              // The device's quantized block itself, decoded here, against the original value.
              codes_far += !close(device.at(dst[i], key, h, s, c), host.at(src[i], key, h, s, c), step, 0.5f);
            }
          }
        }
      }
    }
    EXPECT_EQ(far, 0);
    EXPECT_EQ(codes_far, 0);
  }
}

TEST_F(CudaKvOps, DequantizingTheCpusBlocksGivesTheCpusValuesInBf16) {
  TwinPool pool(quantized_layout(KvQuant::int4), 12);
  pool.fill(0, rng);
  const int32_t q = pool.quantized_id(4, 0);
  pool.seal_on_cpu(*cpu, 0, q);
  const std::vector<int32_t> src = {q}, dst = {1};
  cpu->kv_dequantize(src, dst, pool.cpu);
  gpu->kv_dequantize(src, dst, pool.gpu);
  const DevicePoolCopy copy(pool);
  const PoolReader host{pool.cpu};
  int mismatches = 0;
  for (int h = 0; h < 2; ++h) {
    for (int s = 0; s < kKvQuantGroup; ++s) {
      for (int c = 0; c < 64; ++c) {
        for (bool key : {true, false}) {
          mismatches += copy.reader.at(1, key, h, s, c) != round_bf16(host.at(1, key, h, s, c));
        }
      }
    }
  }
  EXPECT_EQ(mismatches, 0);
}

// --- compaction of layers that start with quantized blocks ---

TEST_F(CudaKvOps, CompactionOfQuantizedLayersMatchesTheCpu) {
  for (KvQuant quant : {KvQuant::int8, KvQuant::int4}) {
    for (int head : {-1, 1}) {
      for (double keep : {0.9, 0.5, 0.2}) {
        SCOPED_TRACE(std::string(quant == KvQuant::int8 ? "int8" : "int4") + ", head " + std::to_string(head) +
                     ", keep " + std::to_string(keep));
        // The layer: 3 quantized groups (96 entries) and then 2 full-precision blocks (40 entries in use).
        TwinPool pool(quantized_layout(quant), 24);
        for (int32_t b = 0; b < 5; ++b) pool.fill(b, rng);
        std::vector<int32_t> table;
        for (int g = 0; g < 3; ++g) {
          table.push_back(pool.quantized_id(5, g));
          pool.seal_on_cpu(*cpu, g, table.back());
        }
        table.push_back(3);
        table.push_back(4);
        const std::vector<int32_t> kept = random_kept(96 + 40, keep, rng);
        cpu->kv_compact(table, kept, pool.cpu, head);
        gpu->kv_compact(table, kept, pool.gpu, head);

        const DevicePoolCopy copy(pool);
        const PoolReader& device = copy.reader;
        const PoolReader host{pool.cpu};
        const int bs = kKvQuantGroup;
        const int kept_quantized = compacted_quantized_blocks(3, int(kept.size()));
        int far = 0;
        for (int j = 0; j < int(kept.size()); ++j) {
          // Entry j of the compacted layer: in quantized group j / 32, or among the full-precision entries.
          const bool quantized = j < kept_quantized * bs;
          const int index = quantized ? j : j - kept_quantized * bs;
          const int32_t block = quantized ? table[size_t(index / bs)] : table[size_t(3 + index / bs)];
          for (int h = head < 0 ? 0 : head; h < (head < 0 ? 2 : head + 1); ++h) {
            for (int c = 0; c < 64; ++c) {
              for (bool key : {true, false}) {
                // Keys of rewritten groups are quantized a second time from values that were themselves
                // quantized: within a step of the CPU's new group on each side.
                const float step = std::max(host.step(block, key, h, index % bs, c),
                                            device.step(block, key, h, index % bs, c));
                far += !close(device.at(block, key, h, index % bs, c), host.at(block, key, h, index % bs, c), step);
              }
            }
          }
        }
        EXPECT_EQ(far, 0);
      }
    }
  }
}

// --- D2O ---

TEST_F(CudaKvOps, NearestKeysMatchTheCpu) {
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
TEST_F(CudaKvOps, NearestKeysOfANanKeyAreCandidateZeroOnBoth) {
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

TEST_F(CudaKvOps, MergesWithSeveralSourcesPerTargetMatchTheCpu) {
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
            far += !close(device.at(b, key, h, s, c), host.at(b, key, h, s, c), 0.0f);
          }
        }
      }
    }
  }
  EXPECT_EQ(far, 0);
}

// --- PoD ---

TEST_F(CudaKvOps, PodAttentionOfTwoSequencesWithAPairedBlockMatchesTheCpu) {
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

TEST_F(CudaKvOps, PairingValuesCopiesTheValueRegionExactly) {
  const KvBlockLayout layout{2, 64, 16, DType::f32};
  TwinPool pool(layout, 6);
  for (int32_t b = 0; b < pool.n_slots; ++b) pool.fill(b, rng);
  const std::vector<int32_t> first = {0, 3}, second = {5, 1};
  cpu->kv_pair_values(first, second, pool.cpu);
  gpu->kv_pair_values(first, second, pool.gpu);
  expect_same_full_pool(pool);
}

TEST_F(CudaKvOps, CodebooksNeedTheCpuBackend) {
  const KvBlockLayout layout{2, 64, 16, DType::f32};
  TwinPool pool(layout, 2);
  const std::vector<int32_t> table = {0}, positions = {0, 1};
  std::vector<int32_t> assignment(2), centres(2);
  EXPECT_THROW(gpu->kv_codebook_build(table, 0, KvPart::key, positions, 0.9f, pool.gpu, assignment, centres),
               std::invalid_argument);
}

}  // namespace
}  // namespace strata
#endif  // STRATA_HAVE_CUDA
