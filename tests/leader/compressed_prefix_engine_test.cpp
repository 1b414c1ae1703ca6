// A compressed prefix shared between requests (leader/prefix_cache.h, [shared-compressed]) through the engine on
// the real SmolLM2: under Expected Attention, prefilled in chunks, questions about one document generate with the
// prefix cache on exactly what they generate with it off (each alone); the later ones start from the first one's
// compressed document (their cached prompt tokens are its last compression point) and, asked together, hold less
// of the pool than their own copies would; when all is done every block is in the pool or the cache, and the
// cache gives every block back when evicted. On a quantized pool the shared blocks are sealed groups. Compressed
// prefixes that do not fill whole blocks are not shared and change nothing.
#include <algorithm>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "daemon/runtime.h"
#include "leader/engine.h"
#include "leader/metrics.h"
#include "tests/leader/clock_document.h"
#include "tests/leader/recording_sink.h"
#include "tests/test_paths.h"

namespace strata {
namespace {

using test::RecordingSink;

constexpr int kChunk = 64;

ServerConfig config_with(const std::string& policy, const std::string& dtype = "f32") {
  ServerConfig config = load_server_config(test::source_path("configs/smollm2-cpu.yaml"));
  config.model.path = test::smollm2_gguf_path();
  config.kv_cache.dtype = dtype;
  config.kv_cache.block_size = 32;
  config.kv_cache.memory_mib = 64;
  config.kv_cache.policy = policy;
  config.kv_cache.prefill_compression = "chunked";
  config.kv_cache.prefill_chunk = kChunk;
  return config;
}

const std::vector<std::string> kQuestions = {" Question: what keeps a clock's time?",
                                             " Question: who built the first clock?",
                                             " Question: why do pendulums swing?",
                                             " Question: what did the keeper wind?"};

// A request's events, and the fewest free blocks the pool had whenever one of them arrived.
class PoolWatchingSink final : public GenerationSink {
 public:
  explicit PoolWatchingSink(const BlockPool& pool) : pool_(pool) {}
  void on_event(GenerationEvent event) override {
    min_free = std::min(min_free, pool_.n_free());
    events.on_event(std::move(event));
  }
  bool cancelled() const override { return false; }

  RecordingSink events;
  int64_t min_free = std::numeric_limits<int64_t>::max();

 private:
  const BlockPool& pool_;
};

struct Served {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<int> cached;
  int64_t fewest_free = 0;  // over the requests asked together
  std::string metrics;
};

// The first question alone, then the others together (or each alone); greedy, 12 tokens each (EOS ignored).
Served serve(const ServerConfig& config, bool prefix_caching, bool together = true) {
  std::unique_ptr<RankRuntime> rt = make_runtime(config);
  ServerMetrics metrics(8192, layer_metrics());
  EngineOptions options = engine_options(config, *rt);
  if (!prefix_caching) options.prefix_cache.reset();
  Engine engine(*rt->executor, *rt->cache, *rt->tokenizer, rt->weights.config, metrics, std::move(options));
  std::vector<std::shared_ptr<PoolWatchingSink>> sinks;
  auto submit = [&](const std::string& question) {
    sinks.push_back(std::make_shared<PoolWatchingSink>(*rt->pool));
    GenerationRequest r;
    r.id = "question";
    r.prompt_ids = rt->tokenizer->encode(test::clock_document() + question, false);
    r.sampling.temperature = 0.0f;
    r.sampling.max_tokens = 12;
    r.sampling.ignore_eos = true;
    r.sink = sinks.back();
    engine.submit(std::move(r));
  };
  submit(kQuestions[0]);
  engine.run_until_idle();
  for (size_t i = 1; i < kQuestions.size(); ++i) {
    submit(kQuestions[i]);
    if (!together) engine.run_until_idle();
  }
  engine.run_until_idle();
  Served out;
  out.fewest_free = rt->pool->n_total();
  for (size_t i = 0; i < sinks.size(); ++i) {
    EXPECT_TRUE(sinks[i]->events.finished) << sinks[i]->events.error;
    out.tokens.push_back(sinks[i]->events.tokens[0]);
    out.cached.push_back(sinks[i]->events.usage.cached_prompt_tokens);
    if (i > 0) out.fewest_free = std::min(out.fewest_free, sinks[i]->min_free);
  }
  // Every block is in the pool or the cache: slot for slot, but a quantized pool packs sealed groups in slabs.
  const int64_t cached_blocks = rt->cache->n_cached_blocks() * rt->cache->n_layers();
  if (rt->pool->quantized()) {
    EXPECT_LE(rt->pool->n_total() - rt->pool->n_free(), cached_blocks);
  } else {
    EXPECT_EQ(rt->pool->n_free() + cached_blocks, rt->pool->n_total());
  }
  for (int l = 0; l < rt->cache->n_layers(); ++l) EXPECT_EQ(rt->cache->layer_usage(l).blocks, 0) << "layer " << l;
  const nlohmann::json state = nlohmann::json::parse(engine.kv_state_json());
  EXPECT_EQ(state.at("prefix_blocks_in_use"), 0) << "no use of a cached block outlives its request";
  out.metrics = metrics.render();
  return out;
}

TEST(CompressedPrefixEngine, QuestionsShareTheCompressedDocumentAndAnswerAsAlone) {
  // 64 entries a layer; and half the prefix at each point (32, 64, 96, then 128 at the last point).
  for (const std::string policy :
       {"expected_attention:budget=64", "expected_attention:budget=50%", "kvzip:budget=64"}) {
    SCOPED_TRACE(policy);
    const ServerConfig config = config_with(policy);
    const Served off = serve(config, false);
    const Served on = serve(config, true);
    EXPECT_EQ(on.tokens, off.tokens) << "each question gets what it gets alone";
    // The prompts' last compression point: the document is longer than it, each prompt's tail is under a chunk.
    const int point = 256;
    EXPECT_EQ(on.cached, (std::vector<int>{0, point, point, point}));
    EXPECT_EQ(off.cached, (std::vector<int>{0, 0, 0, 0}));
    // Three sequences that share the document's blocks instead of holding them each (the cache's token blocks
    // of the first chunk stay too).
    EXPECT_GT(on.fewest_free, off.fewest_free) << "the shared document takes less of the pool";
    EXPECT_NE(on.metrics.find("strata_prefix_cache_compressed_starts_total 3"), std::string::npos) << on.metrics;
  }
}

// int4: the chunked prefill seals the document's groups at every compression point, so the shared blocks are
// sealed groups (cache/kv_cache_quant_test.cpp counts their slabs). Each question is asked alone: on a quantized
// pool a chunked prompt batched may round a value to the other code (docs/decisions.md [capacity]).
TEST(CompressedPrefixEngine, QuantizedPoolsShareSealedGroups) {
  const ServerConfig config = config_with("expected_attention:budget=64", "int4");
  const Served off = serve(config, false, /*together=*/false);
  const Served on = serve(config, true, /*together=*/false);
  EXPECT_EQ(on.tokens, off.tokens) << "each question gets what it gets alone";
  EXPECT_EQ(on.cached, (std::vector<int>{0, 256, 256, 256}));
  EXPECT_NE(on.metrics.find("strata_prefix_cache_compressed_starts_total 3"), std::string::npos) << on.metrics;
}

TEST(CompressedPrefixEngine, WhatIsNotSharedChangesNothing) {
  // 48 entries a layer do not fill whole blocks of 32.
  const ServerConfig config = config_with("expected_attention:budget=48");
  const Served off = serve(config, false);
  const Served on = serve(config, true);
  EXPECT_EQ(on.tokens, off.tokens);
  EXPECT_EQ(on.cached, (std::vector<int>{0, 0, 0, 0}));
}

}  // namespace
}  // namespace strata
