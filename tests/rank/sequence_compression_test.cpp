// What rank/sequence_compression.cpp does to the cache after the policies decide, on the real SmolLM2 through the
// step executor (its only door) with hand-made plans:
//   - sealing: a quantized pool's full groups are quantized once the layer's policy no longer needs them
//     unquantized (by default after the first decode step's hooks), and then at every step;
//   - D2O: a merging layer is never sealed, its merges are counted per layer, and its capacity is reported;
//   - SimLayerKV: each layer's verdict is counted once, under lazy=true or lazy=false;
//   - the per-layer detail names the spec in effect (layer overrides included) and is empty before the prefill.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cache/kv_cache.h"
#include "rank/step_executor.h"
#include "tests/model/smollm2_model.h"
#include "tests/observed.h"

namespace strata {
namespace {

constexpr SeqId kSeq = 1;
constexpr int kPromptTokens = 100;

std::vector<int32_t> prompt() {
  std::vector<int32_t> ids = {1};
  for (int i = 1; i < kPromptTokens; ++i) ids.push_back(300 + (i * 37) % 4000);
  return ids;
}

struct Bed {
  Bed(CompressionConfig config, BlockPool& pool)
      : m(test::smollm2(WeightDtype::automatic)),
        cache(pool, 0, m.model->config().n_layers),
        executor(*m.model, cache, std::move(config), "SmolLM2-135M-Instruct") {}

  void add() {
    StepPlan p;
    p.step = ++step;
    SamplingRule greedy;
    greedy.temperature = 0.0f;
    p.added.push_back(PlannedSequence{kSeq, greedy, 7, std::nullopt, kPromptTokens});
    executor.execute(p);
  }
  // The whole prompt in one step; returns the sampled token.
  int32_t prefill() {
    StepPlan p;
    p.step = ++step;
    p.work.push_back(PlannedWork{kSeq, 0, prompt(), true, kPromptTokens});
    last = executor.execute(p).sampled.at(0).sample.id;
    ++n_tokens;
    return last;
  }
  void decode() {
    StepPlan p;
    p.step = ++step;
    p.work.push_back(PlannedWork{kSeq, kPromptTokens + n_tokens - 1, {last}, true, 0});
    last = executor.execute(p).sampled.at(0).sample.id;
    ++n_tokens;
  }
  void finish() {
    StepPlan p;
    p.step = ++step;
    p.finished.push_back(kSeq);
    executor.execute(p);
  }
  const LayerKv& layer(int l) const { return cache.layer(kSeq, l); }
  int n_layers() const { return cache.n_layers(); }

  test::SmolLm2& m;
  KvCache cache;
  StepExecutor executor;
  uint64_t step = 0;
  int32_t last = 0;
  int n_tokens = 0;
};

BlockPool int4_pool() {
  test::SmolLm2& m = test::smollm2(WeightDtype::automatic);
  KvBlockLayout layout = m.model->kv_layout(32);
  layout.quant = KvQuant::int4;
  return BlockPool(*m.backend, layout, 600);
}

TEST(SequenceCompression, GroupsAreSealedOnceThePolicyNoLongerNeedsThemUnquantized) {
  BlockPool pool = int4_pool();
  Bed bed(CompressionConfig{parse_policy_spec("snapkv:budget=64,window=8"), {}, 0}, pool);
  bed.add();
  bed.prefill();
  for (int l = 0; l < bed.n_layers(); ++l) {
    // SnapKV has cut the prompt to its budget (plus the new entry to come), and nothing is sealed yet: the first
    // decode step's hooks may still read the cache.
    EXPECT_EQ(bed.layer(l).n_entries, 64) << "layer " << l;
    EXPECT_EQ(bed.layer(l).n_quantized_blocks, 0) << "layer " << l;
  }
  for (int step = 0; step < 40; ++step) {
    bed.decode();
    for (int l = 0; l < bed.n_layers(); ++l) {
      // After every decode step every full group is sealed: the entry count rounded down to groups of 32.
      EXPECT_EQ(bed.layer(l).n_entries, 64 + step + 1) << "layer " << l;
      EXPECT_EQ(bed.layer(l).n_quantized_blocks, (64 + step + 1) / 32) << "layer " << l << " after decode " << step;
    }
  }
  bed.finish();
  EXPECT_EQ(pool.n_free(), pool.n_total());
}

TEST(SequenceCompression, D2OMergingLayersStayUnsealedAndCountTheirMerges) {
  BlockPool pool = int4_pool();
  Bed bed(CompressionConfig{parse_policy_spec("d2o:hh_ratio=0.2,recent_ratio=0.2"), {}, 0}, pool);
  bed.add();
  bed.prefill();
  for (int step = 0; step < 12; ++step) bed.decode();
  const std::vector<SequenceLayerDetail> detail = bed.executor.policy_detail(kSeq);
  std::vector<LayerCompressionCounts> counts = bed.executor.take_counts();
  ASSERT_EQ(int(detail.size()), bed.n_layers());
  int merging_layers = 0;
  for (int l = 0; l < bed.n_layers(); ++l) {
    const bool exempt = l == 0 || l == 1 || l == bed.n_layers() - 1;  // D2O's code exempts these (spec, d2o)
    const std::vector<Observation>& observed = detail[size_t(l)].observations;
    if (exempt) {
      EXPECT_FALSE(test::observed(observed, "capacity").has_value()) << "layer " << l;
      EXPECT_FALSE(test::observed(observed, "merged_tokens").has_value()) << "layer " << l;
      EXPECT_EQ(bed.layer(l).n_entries, kPromptTokens + 12) << "layer " << l;
      EXPECT_EQ(bed.layer(l).n_quantized_blocks, (kPromptTokens + 12) / 32) << "an exempt layer is sealed, " << l;
      continue;
    }
    ++merging_layers;
    const int64_t capacity = test::observed(observed, "capacity").value_or(0);
    const int64_t merged = test::observed(observed, "merged_tokens").value_or(0);
    EXPECT_GT(capacity, 0) << "layer " << l;
    EXPECT_LE(bed.layer(l).n_entries, capacity + 1) << "layer " << l;
    EXPECT_GT(merged, 0) << "layer " << l;
    // The merges reported so far are what the layer's counter counted: the sequence's only reports.
    EXPECT_EQ(counts[size_t(l)].observed["merged_tokens"], merged) << "layer " << l;
    EXPECT_EQ(bed.layer(l).n_quantized_blocks, 0) << "a merging layer stays at full precision, " << l;
  }
  EXPECT_EQ(merging_layers, bed.n_layers() - 3);
  bed.finish();
  EXPECT_EQ(pool.n_free(), pool.n_total());
}

TEST(SequenceCompression, EachVerdictIsCountedOnce) {
  test::SmolLm2& m = test::smollm2(WeightDtype::automatic);
  // Whichever way each layer goes, its verdict counts once, in the report after the step that took it.
  Bed bed(CompressionConfig{parse_policy_spec("simlayerkv:threshold=0.6,n_init=4,window=16"), {}, 0}, *m.pool);
  bed.add();
  bed.prefill();
  bed.decode();  // the first decode step decides
  const std::vector<SequenceLayerDetail> detail = bed.executor.policy_detail(kSeq);
  std::vector<LayerCompressionCounts> counts = bed.executor.take_counts();
  for (int l = 0; l < bed.n_layers(); ++l) {
    const std::optional<int64_t> verdict = test::observed(detail[size_t(l)].observations, "lazy");
    ASSERT_TRUE(verdict.has_value()) << "layer " << l;
    EXPECT_EQ(counts[size_t(l)].observations(),
              (std::vector<Observation>{{*verdict ? "lazy=true" : "lazy=false", 1, ObservationKind::count}}))
        << "layer " << l;
  }
  bed.decode();
  for (const LayerCompressionCounts& c : bed.executor.take_counts()) EXPECT_TRUE(c.observations().empty());
  bed.finish();
  EXPECT_EQ(m.pool->n_free(), m.pool->n_total());
}

TEST(SequenceCompression, DetailNamesEachLayersSpecOnceThePrefillStarts) {
  test::SmolLm2& m = test::smollm2(WeightDtype::automatic);
  const CompressionConfig config{parse_policy_spec("streaming:budget=48"),
                                 parse_layer_overrides("0-1=full;29=h2o:budget=32"), 0};
  Bed bed(config, *m.pool);
  bed.add();
  EXPECT_TRUE(bed.executor.policy_detail(kSeq).empty());
  bed.prefill();
  const std::vector<SequenceLayerDetail> detail = bed.executor.policy_detail(kSeq);
  ASSERT_EQ(int(detail.size()), bed.n_layers());
  for (int l = 0; l < bed.n_layers(); ++l) {
    const std::string expected = l <= 1 ? "full" : l == 29 ? to_string(parse_policy_spec("h2o:budget=32"))
                                                           : to_string(parse_policy_spec("streaming:budget=48"));
    EXPECT_EQ(detail[size_t(l)].policy, expected) << "layer " << l;
    EXPECT_EQ(bed.layer(l).n_entries, l <= 1 ? kPromptTokens : l == 29 ? 32 : 48) << "layer " << l;
  }
  bed.finish();
  EXPECT_EQ(m.pool->n_free(), m.pool->n_total());
}

}  // namespace
}  // namespace strata
