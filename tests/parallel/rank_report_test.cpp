#include "parallel/rank_report.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <tuple>
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
  LayerReport l0;
  l0.usage.entries = 10;
  l0.usage.blocks = 2;
  l0.usage.bytes = 16384;
  l0.usage.uncompressed_bytes = 32768;
  l0.usage.cached_blocks = 3;
  l0.evicted_tokens = 3;
  l0.observations = {{"an_amount", 715, ObservationKind::amount}, {"a_count", 4, ObservationKind::count}};
  LayerReport l1;
  l1.usage.entries = -1;
  l1.observations = {{"a_verdict=false", 7, ObservationKind::count}};
  r.layers = {l0, l1};
  r.sequences.push_back(SequenceKv{42, {96, 80}, {6, 5}, 9});  // 9 < 11 blocks: quantized blocks share slots
  r.sequences.push_back(SequenceKv{43, {0, 0}, {0, 0}, 0});     // before its prefill
  SequenceDetail d;
  d.seq = 42;
  d.layers.push_back({"snapkv:budget=96", 300, {}});
  d.layers.push_back({std::string("odd\0name", 8), 300,
                      {{"a_verdict", 1, ObservationKind::verdict}, {"an_amount", 128, ObservationKind::amount},
                       {"nested.amount", 310, ObservationKind::amount}, {"", -5, ObservationKind::count}}});
  r.details.push_back(d);
  r.details.push_back(SequenceDetail{43, {SequenceLayerDetail{}, SequenceLayerDetail{}}});  // no policies yet
  r.result.step = r.step;
  r.result.sampled.push_back(SampledToken{42, RowSample{17, -0.5f, {{17, -0.5f}, {3, -1.25f}}}});
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
  EXPECT_EQ(b.layers[0].usage.uncompressed_bytes, 32768);
  EXPECT_EQ(b.layers[0].usage.cached_blocks, 3);
  EXPECT_EQ(b.layers[0].evicted_tokens, 3);
  EXPECT_EQ(b.layers[0].observations, a.layers[0].observations);
  EXPECT_EQ(b.layers[1].observations, a.layers[1].observations);
  EXPECT_EQ(b.layers[1].usage.entries, -1);
  ASSERT_EQ(b.sequences.size(), 2u);
  const SequenceKv& s = b.sequences[0];
  EXPECT_EQ(s.seq, 42);
  EXPECT_EQ(s.entries, (std::vector<int32_t>{96, 80}));
  EXPECT_EQ(s.blocks, (std::vector<int32_t>{6, 5}));
  EXPECT_EQ(s.blocks_held, 9);
  ASSERT_EQ(b.details.size(), 2u);
  const SequenceLayerDetail& d = b.details[0].layers.at(1);
  EXPECT_EQ(b.details[0].seq, 42);
  EXPECT_EQ(b.details[0].layers[0].appended, 300);
  EXPECT_EQ(d.policy, a.details[0].layers[1].policy);
  EXPECT_EQ(d.observations, a.details[0].layers[1].observations);
  EXPECT_TRUE(b.details[0].layers[0].observations.empty());
  EXPECT_TRUE(b.details[1].layers[0].policy.empty());
  EXPECT_TRUE(b.details[1].layers[1].observations.empty());
  ASSERT_EQ(b.result.sampled.size(), 1u);
  ASSERT_EQ(b.result.sampled[0].sample.top.size(), 2u);
  EXPECT_EQ(b.result.sampled[0].sample.top[1].id, 3);
  EXPECT_EQ(b.result.sampled[0].sample.top[1].logprob, -1.25f);
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
  r = full_report();
  r.details[1].layers.pop_back();
  try {
    deserialize_rank_report(serialize(r));
    ADD_FAILURE() << "a short per-layer detail was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("sequence 43"), std::string::npos) << e.what();
  }
}

TEST(RankReport, AnObservationOfAnUnknownKindIsAnError) {
  RankReport r = full_report();
  r.layers = {LayerReport{}};
  r.layers[0].observations = {{"an_amount", 128, ObservationKind::amount}};
  r.sequences.clear();
  r.details.clear();
  std::vector<uint8_t> bytes = serialize(r);
  // The kind is the byte after the value, the observation's last.
  const std::string name = "an_amount";
  const auto at = std::search(bytes.begin(), bytes.end(), name.begin(), name.end()) + ptrdiff_t(name.size() + 8);
  ASSERT_EQ(*at, uint8_t(ObservationKind::amount));
  *at = 3;
  try {
    deserialize_rank_report(bytes);
    ADD_FAILURE() << "an unknown observation kind was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("'an_amount' of unknown kind 3"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace strata
