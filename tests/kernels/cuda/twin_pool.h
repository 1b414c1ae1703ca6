#pragma once
// The KV pool of the CUDA KV-op tests, twice over: the same contents in an f32 pool on the host for the CPU backend
// and in a bf16 pool on the device (random values are rounded to bf16 first, so both hold the same numbers;
// quantized blocks are sealed on the CPU and their bytes copied, the format being the same), and a reader that
// gives any block's elements whatever its format.
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
#include "kernels/kv_block_layout.h"
#include "tests/kernels/cuda/cuda_test_support.h"

namespace strata::test {

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
    const int bits = kv_quant_bits(quant), per_byte = 8 / bits;
    return (row[c / per_byte] >> (bits * (c % per_byte))) & ((1 << bits) - 1);
  }
  static float scale_at(const uint8_t* p) {  // a stored scale or min (fp16)
    _Float16 x;
    std::memcpy(&x, p, sizeof x);
    return float(x);
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
    return key ? scale_at(q + L.k_scale_offset(head) + kKvScaleBytes * c)
               : scale_at(q + L.v_scale_offset(head, slot) + kKvScaleBytes * (c / kKvQuantGroup));
  }
  float min(int32_t id, bool key, int head, int slot, int c) const {
    const KvBlockLayout& L = view.layout;
    const uint8_t* q = view.block_quantized(id);
    return key ? scale_at(q + L.k_min_offset(head) + kKvScaleBytes * c)
               : scale_at(q + L.v_min_offset(head, slot) + kKvScaleBytes * (c / kKvQuantGroup));
  }
};

// The device's pool downloaded, and read like the CPU's.
struct DevicePoolCopy {
  std::vector<uint8_t> bytes;
  PoolReader reader;
  explicit DevicePoolCopy(const TwinPool& pool)
      : bytes(pool.gpu_memory.read()), reader{KvPoolView{bytes.data(), pool.gpu_layout, pool.n_slots, KvKeyRope{}}} {}
  DevicePoolCopy(const DevicePoolCopy&) = delete;  // reader points into bytes
  DevicePoolCopy& operator=(const DevicePoolCopy&) = delete;
};

// How many of n bytes differ between a and b, and the first that does (-1: none).
struct ByteDifference {
  int64_t count = 0;
  int64_t first = -1;
};
inline ByteDifference byte_difference(const uint8_t* a, const uint8_t* b, int64_t n) {
  ByteDifference d;
  for (int64_t i = 0; i < n; ++i) {
    if (a[i] != b[i] && d.count++ == 0) d.first = i;
  }
  return d;
}

// Every element of every slot, read as full precision, is the same in both pools.
inline void expect_same_full_pool(const TwinPool& pool) {
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

// |gpu - cpu| within `steps` code steps of the CPU's group plus bf16 rounding of the value.
inline bool within_code_steps(float gpu, float cpu, float step, float steps = 1.0f) {
  return std::fabs(double(gpu) - cpu) <= double(steps) * step * 1.001 + std::fabs(double(cpu)) * 0x1p-8 + 1e-6;
}

// The layout of the quantized-pool tests: 2 KV heads of 64 channels, one group of entries per block.
inline KvBlockLayout quantized_layout(KvQuant quant) {
  KvBlockLayout L{2, 64, kKvQuantGroup, DType::f32};
  L.quant = quant;
  return L;
}

}  // namespace strata::test
