// The CUDA backend's kv_quantize and kv_dequantize (kernels/cuda/kv_quantization.cu) against their CPU twins on
// random pools (tests/kernels/cuda/twin_pool.h): sealed blocks byte for byte the CPU's, quantized values within one
// code step of the CPU's group, the dequantization of the CPU's own blocks exactly (in bf16).
// Without a GPU every test skips itself with cuda_unavailable_reason().
#ifdef STRATA_HAVE_CUDA

#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/backend.h"
#include "kernels/kv_block_layout.h"
#include "tests/kernels/cuda/twin_pool.h"

namespace strata {
namespace {

using test::byte_difference;
using test::ByteDifference;
using test::DevicePoolCopy;
using test::PoolReader;
using test::quantized_layout;
using test::round_bf16;
using test::TwinPool;
using test::within_code_steps;
using CudaKvQuantization = test::CudaTest;

// Both pools hold the same bf16 numbers, and the device's seal repeats the CPU's arithmetic operation by operation
// (fp16 scales and mins rounded to nearest even, codes rounded half to even with the rounded pair): the sealed
// blocks are the CPU's byte for byte, scales, mins and codes alike. Dequantized, each side's values are within a
// code step of the other's.
TEST_F(CudaKvQuantization, SealedBlocksAreTheCpusAndDequantizeWithinACodeStep) {
  for (KvQuant quant : {KvQuant::int8, KvQuant::int4, KvQuant::int2}) {
    SCOPED_TRACE(kv_quant_name(quant));
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
              far += !within_code_steps(device.at(back[i], key, h, s, c), host.at(back[i], key, h, s, c), step);
              // The device's quantized block itself, decoded here, against the original value.
              codes_far +=
                  !within_code_steps(device.at(dst[i], key, h, s, c), host.at(src[i], key, h, s, c), step, 0.5f);
            }
          }
        }
      }
    }
    EXPECT_EQ(far, 0);
    EXPECT_EQ(codes_far, 0);
    for (int32_t id : dst) {
      const ByteDifference d = byte_difference(pool.cpu.block_quantized(id),
                                                           device.view.block_quantized(id), L.quantized_block_bytes());
      EXPECT_EQ(d.count, 0) << "block " << id << ": " << d.count << " bytes differ, the first at byte " << d.first;
    }
  }
}

TEST_F(CudaKvQuantization, DequantizingTheCpusBlocksGivesTheCpusValuesInBf16) {
  for (KvQuant quant : {KvQuant::int8, KvQuant::int4, KvQuant::int2}) {
    SCOPED_TRACE(kv_quant_name(quant));
    // As many slots as the test above: an int2 block id from slot 4 of 12 lay beyond the f32 pool's end (the first
    // run on a GPU threw "test pool too small").
    TwinPool pool(quantized_layout(quant), 24);
    const KvBlockLayout& L = pool.cpu_layout;
    pool.fill(0, rng);
    const int32_t q = pool.packed_id(6, 0);
    pool.seal_on_cpu(*cpu, 0, q);
    const std::vector<int32_t> src = {q}, dst = {1};
    cpu->kv_dequantize(src, dst, pool.cpu);
    gpu->kv_dequantize(src, dst, pool.gpu);
    const DevicePoolCopy copy(pool);
    const PoolReader host{pool.cpu};
    int mismatches = 0;
    for (int h = 0; h < L.n_kv_heads; ++h) {
      for (int s = 0; s < kKvQuantGroup; ++s) {
        for (int c = 0; c < L.head_dim; ++c) {
          for (bool key : {true, false}) {
            mismatches += copy.reader.at(1, key, h, s, c) != round_bf16(host.at(1, key, h, s, c));
          }
        }
      }
    }
    EXPECT_EQ(mismatches, 0);
  }
}

}  // namespace
}  // namespace strata

#endif  // STRATA_HAVE_CUDA
