// The KV pool's layout from kv_cache.dtype (daemon/runtime.h, kv_pool_layout): f16 and bf16 make the CPU's blocks
// 16-bit, half an fp32 block's bytes, so the same kv_cache.memory_mib holds twice the tokens; CUDA's pool is bf16
// whatever is asked, so f16 is refused there with an error naming the key; quantized formats keep the backend's
// full-precision blocks for their unsealed entries.
#include <string>

#include <gtest/gtest.h>

#include "cache/block_pool.h"
#include "daemon/runtime.h"
#include "daemon/server_config.h"

namespace strata {
namespace {

ServerConfig config_of(const std::string& backend, const std::string& dtype) {
  ServerConfig config;
  config.engine.backend = backend;
  config.kv_cache.dtype = dtype;
  return config;
}

TEST(KvPoolLayout, HalfPoolsHoldTwiceTheTokensOnTheCpu) {
  const KvBlockLayout cpu{3, 64, 16, DType::f32};
  EXPECT_EQ(kv_pool_layout(config_of("cpu", "f32"), cpu).dtype, DType::f32);
  for (const std::string dtype : {"f16", "bf16"}) {
    const KvBlockLayout half = kv_pool_layout(config_of("cpu", dtype), cpu);
    EXPECT_EQ(dtype_name(half.dtype), dtype);
    EXPECT_EQ(half.quant, KvQuant::none);
    EXPECT_EQ(2 * half.block_bytes(), cpu.block_bytes());
    EXPECT_EQ(BlockPool::blocks_for_memory(half, cpu.block_bytes() * 1000), 2000);
  }
  KvBlockLayout int4_input = cpu;
  int4_input.block_size = kKvQuantGroup;
  ServerConfig int4 = config_of("cpu", "int4");
  int4.kv_cache.block_size = kKvQuantGroup;
  EXPECT_EQ(kv_pool_layout(int4, int4_input).dtype, DType::f32) << "unsealed entries stay in the backend's blocks";
}

TEST(KvPoolLayout, CudaPoolsAreBf16) {
  const KvBlockLayout cuda{3, 64, 16, DType::bf16};
  EXPECT_EQ(kv_pool_layout(config_of("cuda", "f32"), cuda).dtype, DType::bf16);
  EXPECT_EQ(kv_pool_layout(config_of("cuda", "bf16"), cuda).dtype, DType::bf16);
  try {
    kv_pool_layout(config_of("cuda", "f16"), cuda);
    ADD_FAILURE() << "f16 on CUDA was accepted";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("kv_cache.dtype"), std::string::npos) << what;
    EXPECT_NE(what.find("bf16"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace strata
