// The CUDA backend's KV-cache ops (kernels/cuda/cuda_kv_*.cu) against their CPU twins on random inputs: every
// test builds the same pool contents twice, in an f32 pool for the CPU and a bf16 pool on the device (random
// values are rounded to bf16 first, so both hold the same numbers; quantized blocks are sealed on the CPU and
// their bytes copied, the format being the same), runs the op on both backends and compares.
// Moves and pairings must match exactly; quantized values within one code step of the CPU's group; merges and
// attention within bf16 rounding and fp32 reordering; nearest keys within 1e-3, and the same candidate wherever
// the best one is clearly ahead; SpindleKV's codebooks bit for bit (the reasons are with their tests).
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
#include "kernels/kv_codebook.h"
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
  std::vector<float> rope_table;                    // set_key_rope()
  std::unique_ptr<DeviceBuffer> device_rope_table;

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

  // Id q of a quantized block (a quantized pool) or a coded block (otherwise) that lies in slot `first_slot` or
  // later in both pools (their slots pack different numbers of them).
  int32_t packed_id(int first_slot, int q) const {
    const int per_slot = std::max(cpu_layout.packed_per_slot(), gpu_layout.packed_per_slot());
    const int32_t id = n_slots + first_slot * per_slot + q;
    const int64_t last = std::max((int64_t(id) - n_slots) / cpu_layout.packed_per_slot(),
                                  (int64_t(id) - n_slots) / gpu_layout.packed_per_slot());
    if (last >= n_slots) throw std::logic_error("test pool too small for packed block " + std::to_string(q));
    return id;
  }

  // Id v of a codebook vector that lies in slot `first_slot` or later in both pools (fp32 vectors: an f32 slot
  // holds twice as many as a bf16 one).
  int32_t vector_id(int first_slot, int v) const {
    const int64_t per_slot = std::max(cpu_layout.vectors_per_slot(), gpu_layout.vectors_per_slot());
    const int64_t id = first_slot * per_slot + v;
    const int64_t last = std::max(id / cpu_layout.vectors_per_slot(), id / gpu_layout.vectors_per_slot());
    if (last >= n_slots) throw std::logic_error("test pool too small for codebook vector " + std::to_string(v));
    return int32_t(id);
  }

  // A key RoPE table of n_positions on both sides: host memory for the CPU's view, device memory for the GPU's.
  void set_key_rope(RopeStyle style, int n_positions) {
    RopeParams rope;
    rope.style = style;
    rope_table.resize(size_t(n_positions) * size_t(cpu_layout.head_dim));
    key_rope_table(cpu_layout.head_dim, rope, n_positions, rope_table.data());
    device_rope_table = std::make_unique<DeviceBuffer>(sizeof(float) * rope_table.size());
    device_rope_table->write(0, rope_table.data(), sizeof(float) * rope_table.size());
    cpu.key_rope = KvKeyRope{rope_table.data(), n_positions, style};
    gpu.key_rope = KvKeyRope{static_cast<const float*>(device_rope_table->data()), n_positions, style};
  }

  // The CPU's full-precision slot `block`, which holds bf16 numbers, given to the device.
  void upload(int32_t block) {
    const float* f = cpu.block_f32(block);
    std::vector<uint16_t> bits(size_t(cpu_layout.elements_per_block()));
    for (size_t i = 0; i < bits.size(); ++i) bits[i] = bf16_bits(f[i]);
    gpu_memory.write(size_t(block * gpu_layout.block_bytes()), bits.data(), sizeof(uint16_t) * bits.size());
  }

  // Codebook vector `id` := v (fp32) on both sides.
  void write_vector(int32_t id, const std::vector<float>& v) {
    std::copy(v.begin(), v.end(), cpu.codebook_vector(id));
    gpu_memory.write(size_t(id) * cpu_layout.head_dim * sizeof(float), v.data(), sizeof(float) * v.size());
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
    const std::vector<int32_t> dst = {pool.packed_id(6, 0), pool.packed_id(6, 1), pool.packed_id(6, 2)};
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
  const int32_t q = pool.packed_id(4, 0);
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
          table.push_back(pool.packed_id(5, g));
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

// --- SpindleKV's codebooks ---
//
// The device repeats the CPU's arithmetic operation by operation without fused multiply-adds (neither build has
// any): norms are the float of the square root of a double sum of squares in channel order, cosines float sums of
// products in channel order, with correctly rounded division and square root on both sides. On the same numbers
// the results are therefore the CPU's bit for bit, and these tests compare exactly: the build's codebook; the
// match's indices and cosines; the encode's code rows (magnitudes included) and codebook vectors; written-back
// entries as the CPU's f32 reconstruction rounded to bf16 (to nearest even, as the device stores it). A tolerance
// would hide the one-ulp differences that move an entry across the threshold of a build.
//
// The pools: 2 KV heads of 64 channels, blocks of 16 entries, 160 slots (an f32 slot is 16 KiB, a bf16 one 8 KiB).
// KV blocks in slots 0-39; coded blocks (25 to an f32 slot, 12 to a bf16 one) from slot 40 on: f32 slot 40 and
// bf16 slots 83-84 for the 20 used; codebook vectors (64 to an f32 slot, 32 to a bf16 one) from slot 45 on: f32
// slots 45-54 and bf16 slots 90-109 for up to 640 vectors.
constexpr int kCodebookSlots = 160, kKvSlots = 40, kCodedSlot = 40, kVectorSlot = 45;
constexpr int kRopePositions = 2048;

KvBlockLayout codebook_layout() { return KvBlockLayout{2, 64, 16, DType::f32}; }

// The stored form of a key whose direction before RoPE is x: x rotated at `position` with the view's table.
std::vector<float> rotated_key(const KvKeyRope& rope, int head_dim, std::vector<float> x, int32_t position) {
  const int half = head_dim / 2;
  const float* row = rope.table + int64_t(position) * head_dim;
  for (int i = 0; i < half; ++i) {
    const bool interleaved = rope.style == RopeStyle::interleaved;
    const int a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
    const float c = row[i], s = row[half + i], x0 = x[size_t(a)], x1 = x[size_t(b)];
    x[size_t(a)] = x0 * c - x1 * s;
    x[size_t(b)] = x1 * c + x0 * s;
  }
  return x;
}

std::vector<std::vector<float>> random_prototypes(int n, int head_dim, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::vector<float>> prototypes(size_t(n), std::vector<float>(static_cast<size_t>(head_dim)));
  for (auto& p : prototypes) {
    for (float& x : p) x = normal(rng);
  }
  return prototypes;
}

// Entries [0, n) of `table` in every KV head, keys and values alike: a prototype plus noise of one of several sizes
// (0: a scaled copy), times one of several lengths, so that groups form at high thresholds and low ones; keys
// stored after RoPE at their position. Rounded to bf16 and given to both pools.
void fill_clusters(TwinPool& pool, const std::vector<int32_t>& table, int n, const std::vector<int32_t>& positions,
                   const std::vector<std::vector<float>>& prototypes, std::mt19937& rng) {
  const KvBlockLayout& L = pool.cpu_layout;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const float noise[] = {0.0f, 0.03f, 0.1f, 0.2f, 0.35f, 0.6f};
  const float lengths[] = {0.5f, 1.0f, 2.0f, 3.7f};
  auto direction = [&] {
    const std::vector<float>& p = prototypes[rng() % prototypes.size()];
    const float sigma = noise[rng() % 6], length = lengths[rng() % 4];
    std::vector<float> x(p.size());
    for (size_t c = 0; c < p.size(); ++c) x[c] = length * (p[c] + sigma * normal(rng));
    return x;
  };
  for (int e = 0; e < n; ++e) {
    float* block = pool.cpu.block_f32(table[size_t(e / L.block_size)]);
    const int slot = e % L.block_size;
    for (int h = 0; h < L.n_kv_heads; ++h) {
      const std::vector<float> k = rotated_key(pool.cpu.key_rope, L.head_dim, direction(), positions[size_t(e)]);
      const std::vector<float> v = direction();
      for (int c = 0; c < L.head_dim; ++c) {
        block[L.k_offset(h, slot) + c] = round_bf16(k[size_t(c)]);
        block[L.v_offset(h, slot) + c] = round_bf16(v[size_t(c)]);
      }
    }
  }
  for (int32_t b : table) pool.upload(b);
}

// The first n_blocks of the KV slots, shuffled.
std::vector<int32_t> shuffled_table(int n_blocks, std::mt19937& rng) {
  std::vector<int32_t> slots(kKvSlots);
  for (int i = 0; i < kKvSlots; ++i) slots[size_t(i)] = i;
  std::shuffle(slots.begin(), slots.end(), rng);
  slots.resize(size_t(n_blocks));
  return slots;
}

std::vector<int32_t> random_positions(int n, std::mt19937& rng) {
  std::vector<int32_t> positions(static_cast<size_t>(n));
  for (int32_t& p : positions) p = int32_t(rng() % kRopePositions);
  return positions;
}

int largest_group(const std::vector<int32_t>& assignment, int n_codes) {
  std::vector<int> size(size_t(n_codes), 0);
  for (int32_t code : assignment) ++size[size_t(code)];
  return n_codes > 0 ? *std::max_element(size.begin(), size.end()) : 0;
}

const char* style_name(RopeStyle style) { return style == RopeStyle::interleaved ? "interleaved" : "neox"; }

TEST_F(CudaKvOps, CodebookBuildMatchesTheCpu) {
  struct Case {
    int n;
    int n_prototypes;
  };
  // 600 entries around 2 prototypes: at the low threshold a step removes more than 255 entries, past what the
  // device's packed byte counters add in one pass.
  for (const Case& c : {Case{250, 12}, Case{600, 2}}) {
    for (RopeStyle style : {RopeStyle::interleaved, RopeStyle::half_split}) {
      TwinPool pool(codebook_layout(), kCodebookSlots);
      pool.set_key_rope(style, kRopePositions);
      const std::vector<int32_t> table = shuffled_table((c.n + 15) / 16, rng);
      const std::vector<int32_t> positions = random_positions(c.n, rng);
      fill_clusters(pool, table, c.n, positions, random_prototypes(c.n_prototypes, 64, rng), rng);
      for (KvPart part : {KvPart::key, KvPart::value}) {
        for (float threshold : {0.98f, 0.95f, 0.3f}) {
          SCOPED_TRACE(std::to_string(c.n) + " entries, " + style_name(style) +
                       (part == KvPart::key ? ", keys" : ", values") + ", threshold " + std::to_string(threshold));
          std::vector<int32_t> cpu_assignment(size_t(c.n)), cpu_centres(size_t(c.n));
          std::vector<int32_t> gpu_assignment(size_t(c.n), -1), gpu_centres(size_t(c.n), -1);
          const int cpu_codes = cpu->kv_codebook_build(table, 1, part, positions, threshold, pool.cpu, cpu_assignment,
                                                       cpu_centres);
          const int gpu_codes = gpu->kv_codebook_build(table, 1, part, positions, threshold, pool.gpu, gpu_assignment,
                                                       gpu_centres);
          ASSERT_EQ(gpu_codes, cpu_codes);
          EXPECT_EQ(gpu_assignment, cpu_assignment);
          cpu_centres.resize(size_t(cpu_codes));
          gpu_centres.resize(size_t(gpu_codes));
          EXPECT_EQ(gpu_centres, cpu_centres);
          EXPECT_LT(cpu_codes, c.n) << "no group formed: the case tests nothing";
          if (c.n_prototypes == 2 && threshold < 0.5f) {
            EXPECT_GT(largest_group(cpu_assignment, cpu_codes), 255);
          }
        }
      }
    }
  }
}

TEST_F(CudaKvOps, CodebookBuildOfOneEntryAndOfNone) {
  TwinPool pool(codebook_layout(), kCodebookSlots);
  pool.set_key_rope(RopeStyle::interleaved, kRopePositions);
  pool.fill(3, rng);
  const std::vector<int32_t> table = {3}, positions = {77};
  for (KvPart part : {KvPart::key, KvPart::value}) {
    for (Backend* backend : {cpu.get(), gpu.get()}) {
      const KvPoolView& view = backend == cpu.get() ? pool.cpu : pool.gpu;
      std::vector<int32_t> assignment(1, -1), centres(1, -1);
      EXPECT_EQ(backend->kv_codebook_build(table, 0, part, positions, 0.9f, view, assignment, centres), 1);
      EXPECT_EQ(assignment, (std::vector<int32_t>{0}));
      EXPECT_EQ(centres, (std::vector<int32_t>{0}));
      EXPECT_EQ(backend->kv_codebook_build(table, 0, part, {}, 0.9f, view, {}, {}), 0);
    }
  }
}

TEST_F(CudaKvOps, CodebookMatchMatchesTheCpu) {
  for (RopeStyle style : {RopeStyle::interleaved, RopeStyle::half_split}) {
    SCOPED_TRACE(style_name(style));
    TwinPool pool(codebook_layout(), kCodebookSlots);
    pool.set_key_rope(style, kRopePositions);
    const std::vector<int32_t> table = shuffled_table(13, rng);  // 208 entries
    const std::vector<int32_t> positions = random_positions(208, rng);
    const auto prototypes = random_prototypes(6, 64, rng);
    fill_clusters(pool, table, 208, positions, prototypes, rng);
    // 30 fp32 unit vectors near the prototypes; every third is named twice in the codebook, so that equal cosines
    // must resolve to the lower index.
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<int32_t> codebook;
    for (int j = 0; j < 30; ++j) {
      std::vector<float> v = prototypes[size_t(j % 6)];
      double sq = 0.0;
      for (float& x : v) {
        x += 0.2f * normal(rng);
        sq += double(x) * x;
      }
      for (float& x : v) x = float(x / std::sqrt(sq));
      codebook.push_back(pool.vector_id(kVectorSlot, j));
      pool.write_vector(codebook.back(), v);
    }
    for (int j = 0; j < 30; j += 3) codebook.push_back(codebook[size_t(j)]);
    std::vector<int32_t> entries;
    std::vector<int32_t> entry_positions;
    for (int e = 150; e < 208; ++e) {
      entries.push_back(e);
      entry_positions.push_back(positions[size_t(e)]);
    }
    const size_t m = entries.size();
    for (KvPart part : {KvPart::key, KvPart::value}) {
      SCOPED_TRACE(part == KvPart::key ? "keys" : "values");
      for (const std::vector<int32_t>& book : {codebook, std::vector<int32_t>{}}) {
        std::vector<float> cpu_similarity(m), gpu_similarity(m);
        std::vector<int32_t> cpu_index(m), gpu_index(m);
        cpu->kv_codebook_match(table, 1, part, entries, entry_positions, book, pool.cpu, cpu_similarity, cpu_index);
        gpu->kv_codebook_match(table, 1, part, entries, entry_positions, book, pool.gpu, gpu_similarity, gpu_index);
        EXPECT_EQ(gpu_index, cpu_index);
        EXPECT_EQ(gpu_similarity, cpu_similarity);
        if (book.empty()) {
          EXPECT_EQ(cpu_index, std::vector<int32_t>(m, -1));
          EXPECT_EQ(cpu_similarity, std::vector<float>(m, -INFINITY));
        }
      }
    }
  }
}

// The codebook replacement of a layer of 200 entries in both KV heads as KvCache does it (new vectors for the
// build's centres, the 12 full groups coded, the partial one written back), then entry 200 appended to head 1
// with a new key vector and an existing value vector.
TEST_F(CudaKvOps, CodebookEncodeMatchesTheCpu) {
  constexpr int kEntries = 200, kBlock = 16, kGroups = (kEntries + kBlock - 1) / kBlock;
  for (RopeStyle style : {RopeStyle::interleaved, RopeStyle::half_split}) {
    SCOPED_TRACE(style_name(style));
    TwinPool pool(codebook_layout(), kCodebookSlots);
    pool.set_key_rope(style, kRopePositions);
    const std::vector<int32_t> table = shuffled_table(kGroups, rng);
    const std::vector<int32_t> positions = random_positions(kEntries + 1, rng);
    fill_clusters(pool, table, kEntries + 1, positions, random_prototypes(8, 64, rng), rng);
    std::vector<int32_t> coded;
    for (int g = 0; g < kGroups; ++g) coded.push_back(pool.packed_id(kCodedSlot, g));
    int n_vectors = 0;
    auto next_vector = [&] { return pool.vector_id(kVectorSlot, n_vectors++); };

    const std::vector<int32_t> layer_positions(positions.begin(), positions.begin() + kEntries);
    KvCodebookEncoding last;
    for (int h = 0; h < 2; ++h) {
      KvCodebookEncoding e;
      e.head = h;
      e.positions = layer_positions;
      e.coded_blocks = coded;
      e.write_back_from = (kEntries / kBlock) * kBlock;
      for (KvPart part : {KvPart::key, KvPart::value}) {
        std::vector<int32_t> assignment(kEntries), centres(kEntries);
        const float threshold = part == KvPart::key ? 0.95f : 0.9f;
        const int n_codes = cpu->kv_codebook_build(table, h, part, layer_positions, threshold, pool.cpu, assignment,
                                                   centres);
        std::vector<int32_t> ids;
        for (int c = 0; c < n_codes; ++c) {
          ids.push_back(next_vector());
          (part == KvPart::key ? e.new_k_entries : e.new_v_entries).push_back(centres[size_t(c)]);
          (part == KvPart::key ? e.new_k_vectors : e.new_v_vectors).push_back(ids.back());
        }
        for (int32_t code : assignment) (part == KvPart::key ? e.k_vectors : e.v_vectors).push_back(ids[size_t(code)]);
      }
      cpu->kv_codebook_encode(table, e, pool.cpu);
      gpu->kv_codebook_encode(table, e, pool.gpu);
      last = e;
    }
    KvCodebookEncoding appended;
    appended.head = 1;
    appended.entry_begin = kEntries;
    appended.positions = {positions[kEntries]};
    appended.k_vectors = {next_vector()};
    appended.new_k_entries = {kEntries};
    appended.new_k_vectors = appended.k_vectors;
    appended.v_vectors = {last.v_vectors[0]};
    appended.coded_blocks = {coded[kEntries / kBlock]};
    appended.write_back_from = kEntries;
    cpu->kv_codebook_encode(table, appended, pool.cpu);
    gpu->kv_codebook_encode(table, appended, pool.gpu);

    const DevicePoolCopy copy(pool);
    const KvPoolView& device = copy.reader.view;
    int rows_differ = 0, vectors_differ = 0, entries_differ = 0;
    for (int32_t id : coded) {
      for (int i = 0; i < 2 * kBlock; ++i) {  // both heads' rows; rows never coded are zero on both sides
        const KvCodeRow a = device.block_coded(id)[i], b = pool.cpu.block_coded(id)[i];
        rows_differ += a.k_vector != b.k_vector || a.k_magnitude != b.k_magnitude || a.v_vector != b.v_vector ||
                       a.v_magnitude != b.v_magnitude || a.position != b.position;
      }
    }
    for (int v = 0; v < n_vectors; ++v) {
      const int32_t id = pool.vector_id(kVectorSlot, v);
      for (int c = 0; c < 64; ++c) vectors_differ += device.codebook_vector(id)[c] != pool.cpu.codebook_vector(id)[c];
    }
    const PoolReader host{pool.cpu};
    for (int32_t b : table) {
      for (int h = 0; h < 2; ++h) {
        for (int s = 0; s < kBlock; ++s) {
          for (int c = 0; c < 64; ++c) {
            for (bool key : {true, false}) {
              entries_differ += copy.reader.at(b, key, h, s, c) != round_bf16(host.at(b, key, h, s, c));
            }
          }
        }
      }
    }
    EXPECT_EQ(rows_differ, 0);
    EXPECT_EQ(vectors_differ, 0);
    EXPECT_EQ(entries_differ, 0);
  }
}

// Runs op(backend, view) on both backends and expects Exception from each.
template <class Exception, class Op>
void expect_throw_on_both(Backend& cpu, Backend& gpu, const TwinPool& pool, Op op) {
  EXPECT_THROW(op(cpu, pool.cpu), Exception) << "cpu";
  EXPECT_THROW(op(gpu, pool.gpu), Exception) << "cuda";
}

TEST_F(CudaKvOps, CodebookErrorsAreTheCpus) {
  TwinPool pool(codebook_layout(), kCodebookSlots);
  pool.set_key_rope(RopeStyle::interleaved, kRopePositions);
  pool.fill(0, rng);
  pool.fill(1, rng);
  const int32_t coded = pool.packed_id(kCodedSlot, 0), vector = pool.vector_id(kVectorSlot, 0);
  const std::vector<int32_t> table = {0, 1}, positions = {3, 9, 2047};
  auto encoding = [&] {
    KvCodebookEncoding e;
    e.positions = positions;
    e.k_vectors = {vector, vector, vector};
    e.v_vectors = {vector, vector, vector};
    e.new_k_entries = {1};
    e.new_k_vectors = {vector};
    e.coded_blocks = {coded};
    return e;
  };
  std::vector<int32_t> out(3);
  std::vector<float> similarity(1);
  std::vector<int32_t> index(1);

  // Outputs of the wrong size.
  expect_throw_on_both<std::invalid_argument>(*cpu, *gpu, pool, [&](Backend& b, const KvPoolView& view) {
    std::vector<int32_t> short_assignment(2);
    b.kv_codebook_build(table, 0, KvPart::value, positions, 0.9f, view, short_assignment, out);
  });
  // Positions outside the key RoPE table (the values' positions are not read).
  for (int32_t bad : {-1, kRopePositions}) {
    const std::vector<int32_t> bad_positions = {3, bad, 5};
    expect_throw_on_both<std::out_of_range>(*cpu, *gpu, pool, [&](Backend& b, const KvPoolView& view) {
      b.kv_codebook_build(table, 0, KvPart::key, bad_positions, 0.9f, view, out, out);
    });
    expect_throw_on_both<std::out_of_range>(*cpu, *gpu, pool, [&](Backend& b, const KvPoolView& view) {
      b.kv_codebook_match(table, 0, KvPart::key, std::vector<int32_t>{4}, std::vector<int32_t>{bad},
                          std::vector<int32_t>{vector}, view, similarity, index);
    });
    expect_throw_on_both<std::out_of_range>(*cpu, *gpu, pool, [&](Backend& b, const KvPoolView& view) {
      KvCodebookEncoding e = encoding();
      e.positions[2] = bad;
      b.kv_codebook_encode(table, e, view);
    });
  }
  // An entry in a coded block (std::logic_error on the CPU, std::invalid_argument, one of those, on the device).
  expect_throw_on_both<std::logic_error>(*cpu, *gpu, pool, [&](Backend& b, const KvPoolView& view) {
    const std::vector<int32_t> coded_table = {0, coded};
    std::vector<int32_t> assignment(17), centres(17);
    b.kv_codebook_build(coded_table, 0, KvPart::value, std::vector<int32_t>(17, 0), 0.9f, view, assignment, centres);
  });
  // Encodings: vector ids short of the entries, a new vector from an entry that is not encoded, no coded block,
  // and a coded block that is a full-precision slot.
  expect_throw_on_both<std::invalid_argument>(*cpu, *gpu, pool, [&](Backend& b, const KvPoolView& view) {
    KvCodebookEncoding e = encoding();
    e.v_vectors.pop_back();
    b.kv_codebook_encode(table, e, view);
  });
  expect_throw_on_both<std::invalid_argument>(*cpu, *gpu, pool, [&](Backend& b, const KvPoolView& view) {
    KvCodebookEncoding e = encoding();
    e.new_k_entries = {3};
    b.kv_codebook_encode(table, e, view);
  });
  expect_throw_on_both<std::invalid_argument>(*cpu, *gpu, pool, [&](Backend& b, const KvPoolView& view) {
    KvCodebookEncoding e = encoding();
    e.coded_blocks.clear();
    b.kv_codebook_encode(table, e, view);
  });
  expect_throw_on_both<std::invalid_argument>(*cpu, *gpu, pool, [&](Backend& b, const KvPoolView& view) {
    KvCodebookEncoding e = encoding();
    e.coded_blocks = {1};
    b.kv_codebook_encode(table, e, view);
  });
  // The device writes new vectors in parallel: one named twice is refused (the CPU keeps the last).
  KvCodebookEncoding twice = encoding();
  twice.new_v_entries = {2};
  twice.new_v_vectors = {vector};
  EXPECT_THROW(gpu->kv_codebook_encode(table, twice, pool.gpu), std::invalid_argument);
}

}  // namespace
}  // namespace strata
#endif  // STRATA_HAVE_CUDA
