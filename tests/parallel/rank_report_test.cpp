#include "parallel/rank_report.h"

#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace strata {
namespace {

RankReport full_report() {
  RankReport r;
  r.step = 0x1122334455ULL;
  r.world_rank = 5;
  r.pp_stage = 1;
  r.tp_rank = 2;
  r.layer_begin = 15;
  r.block_size = 16;
  r.block_bytes = 8192;
  r.blocks_free = 1234;
  r.blocks_total = 5000;
  r.layers = {LayerReport{10, 2, 16384, 32768, 3, 1, 0, 4, 715, 64}, LayerReport{-1, 0, 0, 0, 0, 0, 7, 0}};
  SequenceReport s;
  s.seq = 42;
  s.entries = {96, 80};
  s.appended = {300, 300};
  s.blocks = {6, 5};
  s.blocks_held = 9;  // fewer than the 11 blocks: quantized blocks share slots
  s.lazy = {-1, 1};
  s.capacity = {-1, 128};
  s.merged = {0, 17};
  s.codebook_keys = {0, 310};
  s.codebook_values = {0, 405};
  s.shared_keys = {0, 32};
  s.policy = {"snapkv:budget=96", std::string("odd\0name", 8)};
  r.sequences.push_back(s);
  SequenceReport before_prefill;  // no policies built yet
  before_prefill.seq = 43;
  before_prefill.entries = {0, 0};
  before_prefill.appended = {0, 0};
  before_prefill.blocks = {0, 0};
  before_prefill.lazy = {-1, -1};
  before_prefill.capacity = {-1, -1};
  before_prefill.merged = {0, 0};
  before_prefill.codebook_keys = {0, 0};
  before_prefill.codebook_values = {0, 0};
  before_prefill.shared_keys = {0, 0};
  r.sequences.push_back(before_prefill);
  r.result.step = r.step;
  r.result.sampled.push_back(SampledToken{42, 17, -0.5f, {17, 3}, {-0.5f, -1.25f}});
  r.error = "rank 3: something";
  return r;
}

TEST(RankReport, RoundTripsEveryField) {
  const RankReport a = full_report();
  const RankReport b = deserialize_rank_report(serialize(a));
  EXPECT_EQ(b.step, a.step);
  EXPECT_EQ(std::tie(b.world_rank, b.pp_stage, b.tp_rank, b.layer_begin, b.block_size),
            std::tie(a.world_rank, a.pp_stage, a.tp_rank, a.layer_begin, a.block_size));
  EXPECT_EQ(std::tie(b.block_bytes, b.blocks_free, b.blocks_total),
            std::tie(a.block_bytes, a.blocks_free, a.blocks_total));
  ASSERT_EQ(b.layers.size(), 2u);
  EXPECT_EQ(b.layers[0].uncompressed_bytes, 32768);
  EXPECT_EQ(b.layers[0].merged_tokens, 4);
  EXPECT_EQ(b.layers[0].codebook_vectors, 715);
  EXPECT_EQ(b.layers[0].shared_keys, 64);
  EXPECT_EQ(b.layers[1].not_lazy_decisions, 7);
  ASSERT_EQ(b.sequences.size(), 2u);
  const SequenceReport& s = b.sequences[0];
  EXPECT_EQ(s.seq, 42);
  EXPECT_EQ(s.entries, (std::vector<int32_t>{96, 80}));
  EXPECT_EQ(s.appended, (std::vector<int32_t>{300, 300}));
  EXPECT_EQ(s.blocks, (std::vector<int32_t>{6, 5}));
  EXPECT_EQ(s.blocks_held, 9);
  EXPECT_EQ(s.lazy, (std::vector<int8_t>{-1, 1}));
  EXPECT_EQ(s.capacity, (std::vector<int32_t>{-1, 128}));
  EXPECT_EQ(s.merged, (std::vector<int64_t>{0, 17}));
  EXPECT_EQ(s.codebook_keys, (std::vector<int64_t>{0, 310}));
  EXPECT_EQ(s.codebook_values, (std::vector<int64_t>{0, 405}));
  EXPECT_EQ(s.shared_keys, (std::vector<int64_t>{0, 32}));
  EXPECT_EQ(s.policy, a.sequences[0].policy);
  EXPECT_TRUE(b.sequences[1].policy.empty());
  ASSERT_EQ(b.result.sampled.size(), 1u);
  EXPECT_EQ(b.result.sampled[0].top_logprobs, (std::vector<float>{-0.5f, -1.25f}));
  EXPECT_EQ(b.error, a.error);
}

TEST(RankReport, TruncatedOrCorruptMessagesAreErrors) {
  const std::vector<uint8_t> bytes = serialize(full_report());
  for (size_t n = 0; n < bytes.size(); n += 7) {
    const std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + ptrdiff_t(n));
    EXPECT_THROW(deserialize_rank_report(cut), std::runtime_error) << n;
  }
  std::vector<uint8_t> longer = bytes;
  longer.push_back(0);
  EXPECT_THROW(deserialize_rank_report(longer), std::runtime_error);
  EXPECT_THROW(deserialize_rank_report(serialize(StepPlan{})), std::runtime_error);
  // Per-layer lists that do not match the layer count.
  RankReport r = full_report();
  r.sequences[0].blocks.pop_back();
  try {
    deserialize_rank_report(serialize(r));
    ADD_FAILURE() << "a short per-layer list was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("sequence 42"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace strata
