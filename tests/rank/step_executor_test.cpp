// The step executor on the real SmolLM2 (weights as the server keeps them), driven by hand-made plans:
//   - greedy tokens through execute(), the prompt in two chunks, equal those of the model's own forward pass
//     and an argmax on the host (the executor adds nothing to the arithmetic);
//   - a seeded draw that is preempted and recomputed draws what it would have drawn;
//   - finishing a sequence gives every block back, preempting one frees its blocks but keeps its sampler;
//   - a layer's policy is applied (SnapKV holds its budget), its counters are reported once, and its detail names
//     the spec in effect;
//   - policies whose declared needs the sequence cannot meet are refused with the key to set;
//   - work for a sequence no plan added is a logic error naming it;
//   - a masked greedy step takes the best allowed token of the model's logits, beside an unmasked sequence in the
//     same step, on the device's path and the host's (keep_logits); a mask on work that samples nothing is refused;
//   - sequences started from a published prefix block generate what a full prefill gives.
#include "rank/step_executor.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cache/kv_cache.h"
#include "rank/offline_executor.h"
#include "tests/model/smollm2_model.h"

namespace strata {
namespace {

const std::vector<int32_t> kPrompt = {1, 4093, 2405, 314, 253, 1345, 28, 253, 2630, 5301,
                                      30, 378, 3536, 314, 2752, 30, 339, 2286, 314, 29};

int32_t argmax(const std::vector<float>& row) {
  return int32_t(std::max_element(row.begin(), row.end()) - row.begin());
}

SamplingRule greedy() {
  SamplingRule rule;
  rule.temperature = 0.0f;
  return rule;
}

CompressionConfig config_of(const std::string& policy, std::vector<LayerOverride> overrides = {}) {
  return CompressionConfig{parse_policy_spec(policy), std::move(overrides)};
}

struct Bed {
  explicit Bed(CompressionConfig config = config_of("full"))
      : m(test::smollm2(WeightDtype::automatic)),
        cache(*m.pool, 0, m.model->config().n_layers),
        executor(*m.model, cache, std::move(config), "SmolLM2-135M-Instruct") {}

  // Adds seq with the prompt in chunks of `chunk`, then decodes; returns the sampled tokens.
  std::vector<int32_t> generate(int64_t seq, const SamplingRule& rule, uint64_t seed, int n_tokens, int chunk) {
    StepPlan add;
    add.step = ++step;
    add.added.push_back(PlannedSequence{seq, rule, seed, std::nullopt, int32_t(kPrompt.size())});
    executor.execute(add);
    return prefill_and_decode(seq, kPrompt, n_tokens, chunk);
  }

  std::vector<int32_t> prefill_and_decode(int64_t seq, const std::vector<int32_t>& known, int n_tokens, int chunk) {
    std::vector<int32_t> out;
    const int n = int(known.size());
    for (int start = 0; start < n; start += chunk) {
      const int len = std::min(chunk, n - start);
      StepPlan p;
      p.step = ++step;
      p.work.push_back(PlannedWork{seq, start, {known.begin() + start, known.begin() + start + len}, start + len == n, n});
      const StepResult r = executor.execute(p);
      if (start + len == n) out.push_back(r.sampled.at(0).sample.id);
    }
    while (int(out.size()) < n_tokens) {
      StepPlan p;
      p.step = ++step;
      p.work.push_back(PlannedWork{seq, n + int(out.size()) - 1, {out.back()}, true, 0});
      out.push_back(executor.execute(p).sampled.at(0).sample.id);
    }
    return out;
  }

  void finish(int64_t seq) {
    StepPlan p;
    p.step = ++step;
    p.finished.push_back(seq);
    executor.execute(p);
  }

  test::SmolLm2& m;
  KvCache cache;
  StepExecutor executor;
  uint64_t step = 0;
};

TEST(StepExecutor, GreedyTokensAreTheModelsArgmax) {
  Bed bed;
  const std::vector<int32_t> tokens = bed.generate(1, greedy(), 0, 8, 12);
  bed.finish(1);

  // The same sequence through the model alone, its logits rows to the host.
  KvCache cache(*bed.m.pool, 0, bed.m.model->config().n_layers);
  std::vector<float> logits;
  const BatchSequence prompt{7, kPrompt, 0, LogitsMode::last};
  bed.m.model->forward({&prompt, 1}, cache, logits);
  std::vector<int32_t> expected = {argmax(logits)};
  while (expected.size() < tokens.size()) {
    const BatchSequence next{7, std::span<const int32_t>(&expected.back(), 1),
                             int(kPrompt.size() + expected.size()) - 1, LogitsMode::last};
    bed.m.model->forward({&next, 1}, cache, logits);
    expected.push_back(argmax(logits));
  }
  cache.release(7);
  EXPECT_EQ(tokens, expected);
}

TEST(StepExecutor, APreemptedDrawDrawsTheSameTokensWhenRecomputed) {
  SamplingRule rule;
  rule.temperature = 1.0f;
  rule.top_k = 40;
  Bed straight;
  const std::vector<int32_t> expected = straight.generate(1, rule, 1234, 10, 20);
  straight.finish(1);

  Bed bed;
  std::vector<int32_t> first = bed.generate(1, rule, 1234, 4, 20);
  StepPlan preempt;
  preempt.step = ++bed.step;
  preempt.preempted.push_back(1);
  bed.executor.execute(preempt);
  EXPECT_FALSE(bed.cache.contains(1)) << "a preempted sequence keeps no blocks";
  // The recompute, as the engine plans it: every known token as a prefill whose end samples the next token,
  // which must be the draw that would have come next.
  std::vector<int32_t> known = kPrompt;
  known.insert(known.end(), first.begin(), first.end());
  const std::vector<int32_t> next = bed.prefill_and_decode(1, known, 1, 16);
  ASSERT_EQ(next.size(), 1u);
  first.push_back(next[0]);
  while (first.size() < expected.size()) {
    StepPlan p;
    p.step = ++bed.step;
    p.work.push_back(PlannedWork{1, int(kPrompt.size() + first.size()) - 1, {first.back()}, true, 0});
    first.push_back(bed.executor.execute(p).sampled.at(0).sample.id);
  }
  bed.finish(1);
  EXPECT_EQ(first, expected);
}

TEST(StepExecutor, FinishingGivesEveryBlockBack) {
  Bed bed;
  const int64_t free_before = bed.m.pool->n_free();
  bed.generate(1, greedy(), 0, 3, 20);
  EXPECT_LT(bed.m.pool->n_free(), free_before);
  bed.finish(1);
  EXPECT_EQ(bed.m.pool->n_free(), free_before);
  EXPECT_TRUE(bed.executor.policy_detail(1).empty());
}

TEST(StepExecutor, AppliesTheLayersPolicyAndReportsItOnce) {
  const int budget = 12;
  Bed bed(config_of("snapkv:budget=" + std::to_string(budget) + ",window=4", {{0, 1, parse_policy_spec("full")}}));
  bed.generate(1, greedy(), 0, 2, 20);
  const std::vector<LayerCompressionCounts> counts = bed.executor.take_counts();
  const std::vector<SequenceLayerDetail> detail = bed.executor.policy_detail(1);
  const int n_layers = bed.m.model->config().n_layers;
  ASSERT_EQ(int(counts.size()), n_layers);
  ASSERT_EQ(int(detail.size()), n_layers);
  const int n = int(kPrompt.size());
  for (int l = 0; l < n_layers; ++l) {
    const bool full = l <= 1;
    // The prompt, compressed at its end, then the first decode step's token.
    EXPECT_EQ(bed.cache.layer(1, l).n_entries, (full ? n : budget) + 1) << "layer " << l;
    EXPECT_EQ(counts[size_t(l)].evicted_tokens, full ? 0 : n - budget) << "layer " << l;
    EXPECT_EQ(detail[size_t(l)].policy, full ? "full" : to_string(parse_policy_spec("snapkv:budget=12,window=4")));
  }
  for (const LayerCompressionCounts& c : bed.executor.take_counts()) EXPECT_EQ(c.evicted_tokens, 0);
  bed.finish(1);
}

// Prefix caching: the prompt's first block is published as it is prefilled; sequences that start from it generate
// what a full prefill gives, with `full` and with SnapKV (its observation window lies after the block), SnapKV's
// compaction changes only its own copy, and once every sequence has finished and the block is evicted the pool is
// whole again.
TEST(StepExecutor, SequencesStartedFromAPublishedBlockGenerateTheSame) {
  Bed bed;
  const int64_t free_before = bed.m.pool->n_free();
  const int bs = bed.cache.block_size(), n = int(kPrompt.size());
  ASSERT_GT(n, bs) << "the prompt needs a full block";
  const std::vector<uint64_t> chain = {0xabcULL};
  // Six greedy tokens of seq: its prompt from `start` in one chunk (after the cached block when start > 0).
  auto run = [&](int64_t seq, int start, std::optional<PolicySpec> policy, bool publish) {
    StepPlan p;
    p.step = ++bed.step;
    p.added.push_back(PlannedSequence{seq, greedy(), 0, std::move(policy), n});
    if (start > 0) p.prefix_started.push_back(PrefixStart{seq, chain, n});
    p.work.push_back(PlannedWork{seq, start, {kPrompt.begin() + start, kPrompt.end()}, true, n});
    if (publish) p.prefix_published.push_back(PrefixPublish{seq, 0, chain[0]});
    std::vector<int32_t> out = {bed.executor.execute(p).sampled.at(0).sample.id};
    while (out.size() < 6) {
      StepPlan d;
      d.step = ++bed.step;
      d.work.push_back(PlannedWork{seq, n + int(out.size()) - 1, {out.back()}, true, 0});
      out.push_back(bed.executor.execute(d).sampled.at(0).sample.id);
    }
    bed.finish(seq);
    return out;
  };
  const std::vector<int32_t> expected = run(1, 0, std::nullopt, /*publish=*/true);
  ASSERT_TRUE(bed.cache.is_cached(chain[0]));
  EXPECT_EQ(run(2, bs, std::nullopt, false), expected);
  const PolicySpec snapkv = parse_policy_spec("snapkv:budget=8,window=4");
  EXPECT_EQ(run(3, bs, snapkv, false), run(4, 0, snapkv, false));
  EXPECT_EQ(run(5, bs, std::nullopt, false), expected) << "SnapKV compacted a copy, not the cached block";
  EXPECT_EQ(bed.m.pool->n_free(), free_before - bed.cache.n_layers()) << "only the cached block is held";
  StepPlan evict;
  evict.step = ++bed.step;
  evict.prefix_evicted = chain;
  bed.executor.execute(evict);
  EXPECT_EQ(bed.m.pool->n_free(), free_before);
}

TEST(StepExecutor, RefusesPoliciesWhoseNeedsTheSequenceCannotMeet) {
  Bed bed;
  auto start = [&](const std::string& policy) {
    StepPlan p;
    p.step = ++bed.step;
    p.added.push_back(PlannedSequence{5, greedy(), 0, parse_policy_spec(policy), int32_t(kPrompt.size())});
    p.work.push_back(PlannedWork{5, 0, kPrompt, true, int32_t(kPrompt.size())});
    try {
      bed.executor.execute(p);
      ADD_FAILURE() << policy << ": accepted";
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  // PoD shares keys across layers: it needs the layer blocks strata calibrate makes.
  EXPECT_NE(start("pod").find("kv_cache.pod_blocks"), std::string::npos);
  bed.finish(5);
}

// Tokens id % 7 == 3 allowed, but not the unmasked argmax.
std::vector<uint64_t> every_seventh_but(int32_t excluded, int64_t vocab) {
  std::vector<uint64_t> mask(size_t(mask_words(vocab)), 0);
  for (int64_t id = 3; id < vocab; id += 7) {
    if (id != excluded) mask_set(mask, id);
  }
  return mask;
}

TEST(StepExecutor, AMaskedGreedyStepTakesTheBestAllowedToken) {
  Bed bed;
  const int64_t vocab = bed.m.model->config().vocab_size;
  KvCache cache(*bed.m.pool, 0, bed.m.model->config().n_layers);
  std::vector<float> logits;
  const BatchSequence alone{7, kPrompt, 0, LogitsMode::last};
  bed.m.model->forward({&alone, 1}, cache, logits);
  cache.release(7);
  const int32_t unmasked = argmax(logits);
  const std::vector<uint64_t> mask = every_seventh_but(unmasked, vocab);
  int32_t best_allowed = -1;
  for (int64_t id = 0; id < vocab; ++id) {
    if (token_allowed(mask, id) && (best_allowed < 0 || logits[size_t(id)] > logits[size_t(best_allowed)])) {
      best_allowed = int32_t(id);
    }
  }
  double sum = 0.0;  // log_softmax over the allowed tokens
  for (int64_t id = 0; id < vocab; ++id) {
    if (token_allowed(mask, id)) sum += std::exp(double(logits[size_t(id)]) - logits[size_t(best_allowed)]);
  }

  for (bool on_host : {false, true}) {
    SCOPED_TRACE(on_host ? "sampled on the host" : "sampled where the logits are");
    OfflineExecutor(bed.executor).keep_logits(on_host);
    SamplingRule rule = greedy();
    rule.n_logprobs = 2;
    StepPlan p;
    p.step = ++bed.step;
    p.added = {PlannedSequence{1, rule, 0, std::nullopt, int32_t(kPrompt.size())},
               PlannedSequence{2, rule, 0, std::nullopt, int32_t(kPrompt.size())}};
    const int32_t n = int32_t(kPrompt.size());
    p.work = {PlannedWork{1, 0, kPrompt, true, n, mask}, PlannedWork{2, 0, kPrompt, true, n}};
    const StepResult r = bed.executor.execute(p);
    ASSERT_EQ(r.sampled.size(), 2u);
    EXPECT_EQ(r.sampled[0].sample.id, best_allowed);
    EXPECT_NEAR(r.sampled[0].sample.logprob, -std::log(sum), 1e-3);
    ASSERT_EQ(r.sampled[0].sample.top.size(), 2u);
    EXPECT_TRUE(token_allowed(mask, r.sampled[0].sample.top[1].id));
    EXPECT_EQ(r.sampled[1].sample.id, unmasked) << "the unmasked sequence of the same step";
    bed.finish(1);
    bed.finish(2);
  }
}

TEST(StepExecutor, AMaskOnWorkThatSamplesNothingIsALogicErrorNamingIt) {
  Bed bed;
  StepPlan p;
  p.step = ++bed.step;
  p.added.push_back(PlannedSequence{4, greedy(), 0, std::nullopt, int32_t(kPrompt.size())});
  const std::vector<uint64_t> mask(size_t(mask_words(bed.m.model->config().vocab_size)), ~uint64_t(0));
  p.work.push_back(PlannedWork{4, 0, {kPrompt.begin(), kPrompt.begin() + 4}, false, int32_t(kPrompt.size()), mask});
  try {
    bed.executor.execute(p);
    ADD_FAILURE() << "accepted";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("sequence 4 has a mask"), std::string::npos) << e.what();
  }
}

TEST(StepExecutor, WorkForAnUnknownSequenceIsALogicErrorNamingIt) {
  Bed bed;
  StepPlan p;
  p.step = 1;
  p.work.push_back(PlannedWork{99, 0, {1, 2}, true, 2});
  try {
    bed.executor.execute(p);
    ADD_FAILURE() << "accepted";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("99"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace strata
