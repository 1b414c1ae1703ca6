// The CUDA backend's kv_compact (kernels/cuda/kv_compaction.cu) against its CPU twin on random pools
// (tests/kernels/cuda/twin_pool.h): full-precision moves must match exactly, the entries of layers that start with
// quantized blocks within a code step of the CPU's group, and their quantized blocks byte for byte.
// Without a GPU every test skips itself with cuda_unavailable_reason().
#ifdef STRATA_HAVE_CUDA

#include <algorithm>
#include <cstdint>
#include <random>
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
using test::TwinPool;
using test::within_code_steps;
using CudaKvCompaction = test::CudaTest;

std::vector<int32_t> random_kept(int n_entries, double keep, std::mt19937& rng) {
  std::bernoulli_distribution take(keep);
  std::vector<int32_t> kept;
  for (int e = 0; e < n_entries; ++e) {
    if (take(rng)) kept.push_back(e);
  }
  return kept;
}

// The test layer: random numbers in slots 0-4, slots 0-2 sealed on the CPU into 3 quantized groups (96 entries),
// the same bytes given to the device, then full-precision blocks 3 and 4 (40 entries in use).
std::vector<int32_t> quantized_layer(TwinPool& pool, Backend& cpu, std::mt19937& rng) {
  for (int32_t b = 0; b < 5; ++b) pool.fill(b, rng);
  std::vector<int32_t> table;
  for (int g = 0; g < 3; ++g) {
    table.push_back(pool.packed_id(5, g));
    pool.seal_on_cpu(cpu, g, table.back());
  }
  table.push_back(3);
  table.push_back(4);
  return table;
}

TEST_F(CudaKvCompaction, CompactionOfFullPrecisionLayersMovesEntriesExactly) {
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

TEST_F(CudaKvCompaction, CompactionOfQuantizedLayersMatchesTheCpu) {
  for (KvQuant quant : {KvQuant::int8, KvQuant::int4, KvQuant::int2}) {
    for (int head : {-1, 1}) {
      for (double keep : {0.9, 0.5, 0.2}) {
        SCOPED_TRACE(std::string(kv_quant_name(quant)) + ", head " + std::to_string(head) +
                     ", keep " + std::to_string(keep));
        TwinPool pool(quantized_layout(quant), 24);
        const std::vector<int32_t> table = quantized_layer(pool, *cpu, rng);
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
                far += !within_code_steps(device.at(block, key, h, index % bs, c),
                                          host.at(block, key, h, index % bs, c), step);
              }
            }
          }
        }
        EXPECT_EQ(far, 0);
      }
    }
  }
}

// The quantized blocks of a compacted layer, on the device, against the CPU's byte for byte: both dequantize keys
// to fp32 and requantize them per channel, and copy or seal values, with the same arithmetic from the same bf16
// numbers. With head 1 alone, head 0's bytes stay as they were on both sides. When a whole group is evicted (what
// decode-time eviction on a quantized pool does), group 2 moves into group 1's block exactly as the CPU sealed it.
TEST_F(CudaKvCompaction, QuantizedBlocksAfterCompactionAreTheCpusByteForByte) {
  for (KvQuant quant : {KvQuant::int8, KvQuant::int4, KvQuant::int2}) {
    for (int head : {-1, 1}) {
      for (bool whole_group : {true, false}) {
        SCOPED_TRACE(std::string(kv_quant_name(quant)) + ", head " + std::to_string(head) +
                     (whole_group ? ", group 1 evicted" : ", half kept at random"));
        TwinPool pool(quantized_layout(quant), 24);
        const std::vector<int32_t> table = quantized_layer(pool, *cpu, rng);
        const int64_t n = pool.cpu_layout.quantized_block_bytes();
        const uint8_t* sealed_group_2 = pool.cpu.block_quantized(table[2]);
        const std::vector<uint8_t> group_2(sealed_group_2, sealed_group_2 + n);
        std::vector<int32_t> kept;
        if (whole_group) {
          for (int e = 0; e < 96 + 40; ++e) {
            if (e < 32 || e >= 64) kept.push_back(e);
          }
        } else {
          kept = random_kept(96 + 40, 0.5, rng);
        }
        cpu->kv_compact(table, kept, pool.cpu, head);
        gpu->kv_compact(table, kept, pool.gpu, head);

        const DevicePoolCopy copy(pool);
        const int kept_quantized = compacted_quantized_blocks(3, int(kept.size()));
        for (int b = 0; b < kept_quantized; ++b) {
          const ByteDifference d = byte_difference(
              pool.cpu.block_quantized(table[size_t(b)]), copy.reader.view.block_quantized(table[size_t(b)]), n);
          EXPECT_EQ(d.count, 0) << "quantized block " << b << ": " << d.count << " bytes differ, the first at byte "
                                << d.first;
        }
        if (whole_group && head < 0) {
          const ByteDifference d = byte_difference(group_2.data(), copy.reader.view.block_quantized(table[1]), n);
          EXPECT_EQ(d.count, 0) << "group 2 in group 1's block: " << d.count << " bytes differ, the first at byte "
                                << d.first;
        }
      }
    }
  }
}

}  // namespace
}  // namespace strata

#endif  // STRATA_HAVE_CUDA
