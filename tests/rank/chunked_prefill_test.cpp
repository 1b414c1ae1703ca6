// Chunked prefill compression on the real SmolLM2, through the step executor with hand-made plans: a long prompt
// is compressed after every chunk, so that no layer ever holds more than its budget plus one chunk; where the
// scheduler cuts the prompt does not change what is kept (the compression points are positions); a chunk that
// passes a point is compressed at its end; a quantized pool seals groups before the prompt ends; SnapKV scores a
// chunk by the prompt's last tokens run after it, as a plain forward pass of the chunk and those tokens scores it;
// and a policy without a chunked form is refused naming the key.
#include <algorithm>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cache/kv_cache.h"
#include "cache/policies/selection.h"
#include "cache/pooled_layer_keys.h"
#include "cache/prefill_footprint.h"
#include "cache/scoring_tokens.h"
#include "rank/step_executor.h"
#include "tests/model/smollm2_model.h"

namespace strata {
namespace {

constexpr int kChunk = 32;

// 300 prompt tokens: a sentence's ids again and again, every repeat shifted so that no two are the same.
std::vector<int32_t> long_prompt() {
  const std::vector<int32_t> sentence = {4093, 2405, 314, 253, 1345, 28, 253, 2630, 5301, 30, 378, 3536, 314, 2752, 30};
  std::vector<int32_t> out = {1};
  for (int r = 0; int(out.size()) < 300; ++r) {
    for (int32_t id : sentence) out.push_back(id + r % 7);
  }
  out.resize(300);
  return out;
}

struct Bed {
  Bed(const std::string& policy, BlockPool* quantized_pool = nullptr, const std::string& overrides = "")
      : m(test::smollm2(WeightDtype::automatic)),
        cache(quantized_pool ? *quantized_pool : *m.pool, 0, m.model->config().n_layers),
        config{parse_policy_spec(policy), parse_layer_overrides(overrides), kChunk},
        executor(*m.model, cache, config, "SmolLM2-135M-Instruct") {}

  // The scoring rows of a prompt of n tokens, as the leader counts them.
  ScoringRows scoring_rows(int n) const {
    const ModelConfig& c = m.model->config();
    PolicyContext context;
    context.n_layers_total = c.n_layers;
    context.n_heads = c.n_heads;
    context.n_kv_heads = c.n_kv_heads;
    return prefill_scoring_rows(config, std::nullopt, context, n);
  }

  // Prefills `prompt` in pieces of the given sizes (cycled), then decodes; after every step, `check` sees the
  // cache and the position reached. Returns the sampled tokens.
  template <typename Check>
  std::vector<int32_t> run(const std::vector<int32_t>& prompt, std::vector<int> pieces, int n_tokens, Check check) {
    StepPlan add;
    add.step = ++step;
    SamplingRule greedy;
    greedy.temperature = 0.0f;
    add.added.push_back(PlannedSequence{1, greedy, 7, std::nullopt, int32_t(prompt.size())});
    executor.execute(add);
    const int n = int(prompt.size());
    std::vector<int32_t> out;
    for (int start = 0, i = 0; start < n; ++i) {
      const int len = std::min(pieces[size_t(i) % pieces.size()], n - start);
      StepPlan p;
      p.step = ++step;
      const std::vector<int32_t> piece(prompt.begin() + start, prompt.begin() + start + len);
      p.work.push_back(PlannedWork{1, start, piece, start + len == n, n});
      if ((start + len) % kChunk == 0 && start + len < n) {
        append_scoring_rows(p.work.back(), scoring_tokens(scoring_rows(n), config, prompt, start + len));
      }
      const StepResult r = executor.execute(p);
      start += len;
      check(start);
      if (start == n) out.push_back(r.sampled.at(0).sample.id);
    }
    while (int(out.size()) < n_tokens) {
      StepPlan p;
      p.step = ++step;
      p.work.push_back(PlannedWork{1, n + int(out.size()) - 1, {out.back()}, true, 0});
      out.push_back(executor.execute(p).sampled.at(0).sample.id);
    }
    StepPlan done;
    done.step = ++step;
    done.finished.push_back(1);
    executor.execute(done);
    return out;
  }

  int max_entries() const {
    int most = 0;
    for (int l = 0; l < cache.n_layers(); ++l) most = std::max(most, cache.layer(1, l).n_entries);
    return most;
  }

  test::SmolLm2& m;
  KvCache cache;
  CompressionConfig config;
  StepExecutor executor;
  uint64_t step = 0;
};

TEST(ChunkedPrefill, NoLayerHoldsMoreThanItsBudgetPlusAChunk) {
  for (const std::string policy :
       {"streaming:budget=40", "h2o:budget=40", "snapkv:budget=40,window=8", "pyramidkv:budget=40"}) {
    Bed bed(policy);
    // PyramidKV's lowest layer keeps the most (spec pyramidkv.md 3.4: with a = 40 - 8, k_0 = 2a - floor(a / 20)
    // = 63, plus the window).
    const int budget = policy.rfind("pyramidkv", 0) == 0 ? 63 + 8 : 40;
    // Pieces of half a chunk: between two compressions a layer grows past its budget, then is cut back.
    const std::vector<int32_t> tokens = bed.run(long_prompt(), {kChunk / 2}, 4, [&](int reached) {
      const int held = bed.max_entries();
      EXPECT_LE(held, budget + kChunk) << policy << " at " << reached;
      if (reached % kChunk == 0) {
        EXPECT_LE(held, budget) << policy << ": compressed at " << reached;
      } else if (reached > budget + kChunk && reached < 300) {
        EXPECT_GT(held, budget) << policy << ": half a chunk appended at " << reached;
      }
    });
    EXPECT_EQ(tokens.size(), 4u);
    EXPECT_EQ(bed.m.pool->n_free(), bed.m.pool->n_total()) << policy;
  }
}

// The ranks compress at positions, not at the scheduler's chunks: pieces of 32, of 16 and of 8 + 24 give the same
// tokens (greedy) and keep the same entries.
// SnapKV's layers score each chunk by the prompt's last tokens, run after it; a StreamingLLM layer beside them
// (overrides) keeps the sinks and the chunk's own last entries, never those scoring rows, which leave every layer.
TEST(ChunkedPrefill, ALayerThatAsksForNoScoringRowsCutsWithoutThem) {
  Bed bed("snapkv:budget=40,window=8", nullptr, "0-9=streaming:budget=40,sinks=4");
  const std::vector<int32_t> prompt = long_prompt();
  ASSERT_EQ(bed.scoring_rows(int(prompt.size())).count, 8);
  const std::vector<int32_t> tokens = bed.run(prompt, {kChunk}, 2, [&](int reached) {
    if (reached % kChunk != 0 || reached == int(prompt.size())) return;
    for (int l = 0; l < bed.cache.n_layers(); ++l) {
      const LayerKv& layer = bed.cache.layer(1, l);
      EXPECT_EQ(layer.n_entries, std::min(40, reached)) << "layer " << l << " at " << reached;
      EXPECT_EQ(layer.n_appended, reached) << "layer " << l << ": the scoring rows are gone";
    }
  });
  EXPECT_EQ(tokens.size(), 2u);
}

TEST(ChunkedPrefill, WhereTheSchedulerCutsThePromptChangesNothing) {
  for (const std::string policy : {"h2o:budget=40", "snapkv:budget=40,window=8"}) {
    std::vector<std::vector<int32_t>> outputs;
    for (const std::vector<int>& pieces : {std::vector<int>{32}, {16}, {8, 24}}) {
      Bed bed(policy);
      outputs.push_back(bed.run(long_prompt(), pieces, 6, [](int) {}));
    }
    EXPECT_EQ(outputs[1], outputs[0]) << policy;
    EXPECT_EQ(outputs[2], outputs[0]) << policy;
  }
}

TEST(ChunkedPrefill, AChunkThatPassesAPointIsCompressedAtItsEnd) {
  Bed bed("streaming:budget=40");
  bed.run(long_prompt(), {50}, 1, [&](int reached) {
    if (reached < 300) {
      EXPECT_LE(bed.max_entries(), 40) << "at " << reached;
    }
  });
}

TEST(ChunkedPrefill, AQuantizedPoolSealsGroupsBeforeThePromptEnds) {
  test::SmolLm2& m = test::smollm2(WeightDtype::automatic);
  KvBlockLayout layout = m.model->kv_layout(32);
  layout.quant = KvQuant::int4;
  BlockPool pool(*m.backend, layout, 600);
  Bed bed("snapkv:budget=64,window=8", &pool);
  bool sealed_early = false;
  bed.run(long_prompt(), {kChunk}, 2, [&](int reached) {
    if (reached < 300 && bed.cache.layer(1, 0).n_quantized_blocks > 0) sealed_early = true;
  });
  EXPECT_TRUE(sealed_early);
}

// One number per entry of every KV head of a layer: its key dotted with a fixed vector (Backend::kv_key_forms).
std::vector<std::vector<float>> key_prints(const KvCache& cache, SeqId seq, int layer, int n_kv_heads, int head_dim) {
  const int n = cache.layer(seq, layer).n_entries;
  std::vector<float> direction(static_cast<size_t>(head_dim));
  std::vector<float> quadratic(static_cast<size_t>(head_dim) * static_cast<size_t>(head_dim), 0.0f);
  for (int i = 0; i < head_dim; ++i) direction[size_t(i)] = float((i * 7) % 13) - 6.0f;
  std::vector<std::vector<float>> prints;
  for (int h = 0; h < n_kv_heads; ++h) {
    std::vector<float> forms(static_cast<size_t>(n)), norms(static_cast<size_t>(n));
    PooledLayerKeys(cache, seq, layer).key_forms(h, direction, quadratic, forms, norms);
    prints.push_back(std::move(forms));
  }
  return prints;
}

// At the first compression point the layer holds the chunk's 32 entries and the prompt's last 8 tokens run after
// it (positions 32-39). A plain forward pass of those 40 tokens, summing the last 8 rows' attention, gives the
// scores; SnapKV's selection over the chunk's entries by them is what the sequence keeps, in every layer and KV
// head (the same rows, so the same bits).
TEST(ChunkedPrefill, SnapKvScoresAChunkByThePromptsLastTokens) {
  Bed bed("snapkv:budget=16,window=8,kernel=1");
  const std::vector<int32_t> prompt = long_prompt();
  ASSERT_EQ(bed.scoring_rows(int(prompt.size())).count, 8);
  const ModelConfig& c = bed.m.model->config();
  std::vector<std::vector<std::vector<float>>> kept;  // [layer][KV head][entry]
  bed.run(prompt, {kChunk}, 1, [&](int reached) {
    if (reached != kChunk) return;
    for (int l = 0; l < c.n_layers; ++l) kept.push_back(key_prints(bed.cache, 1, l, c.n_kv_heads, c.head_dim));
  });
  ASSERT_EQ(int(kept.size()), c.n_layers);

  std::vector<int32_t> tokens(prompt.begin(), prompt.begin() + kChunk);
  tokens.insert(tokens.end(), prompt.end() - 8, prompt.end());
  KvCache reference(*bed.m.pool, 0, c.n_layers);
  AttentionStats stats;
  stats.stride = int(tokens.size());
  for (int l = 0; l < c.n_layers; ++l) {
    stats.rows_from.push_back(kChunk);
    stats.sums.emplace_back(size_t(c.n_heads) * tokens.size(), 0.0f);
  }
  const BatchSequence b{9, tokens, 0, LogitsMode::none, &stats};
  std::vector<float> logits;
  bed.m.model->forward(std::span(&b, 1), reference, logits);
  for (int l = 0; l < c.n_layers; ++l) {
    LayerState chunk;
    chunk.n_entries = kChunk;
    chunk.column_sums = stats.sums[size_t(l)].data();
    chunk.sums_stride = stats.stride;
    const Selection selection = select_top_plus_window(chunk, c.n_heads, c.n_kv_heads, 8, 8, WindowScoring{});
    const std::vector<std::vector<float>> all = key_prints(reference, 9, l, c.n_kv_heads, c.head_dim);
    for (int h = 0; h < c.n_kv_heads; ++h) {
      std::vector<float> expected;
      for (int32_t e : selection.kept[size_t(h)]) expected.push_back(all[size_t(h)][size_t(e)]);
      EXPECT_EQ(kept[size_t(l)][size_t(h)], expected) << "layer " << l << ", KV head " << h;
    }
  }
  reference.release(9);
}

TEST(ChunkedPrefill, APolicyWithoutAChunkedFormIsRefusedNamingTheKey) {
  Bed bed("full");
  try {
    bed.executor.check_request_policy(parse_policy_spec("simlayerkv"));
    FAIL() << "simlayerkv has no chunked form";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("kv_cache.prefill_compression"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(bed.executor.check_request_policy(parse_policy_spec("snapkv")));
}

}  // namespace
}  // namespace strata
