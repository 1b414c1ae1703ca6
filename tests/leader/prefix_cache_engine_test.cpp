// Prefix caching through the engine on the real SmolLM2 (leader/prefix_cache.h): requests that share a document
// and ask different questions generate, with the cache on, exactly what they generate with it off, with `full`,
// SnapKV, PyramidKV, SimLayerKV, rolling StreamingLLM and SpindleKV, on f32, int8 and int4 pools; the later requests
// report their cached prompt tokens; H2O and D2O (which read every prompt row) and PoD take no hits and keep their
// outputs; when the requests are done every block is in the pool or the cache; a pool too small to keep the cache
// evicts it instead of failing anyone; and sequences preempted and recomputed from cached blocks generate the same.
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "daemon/runtime.h"
#include "leader/engine.h"
#include "leader/metrics.h"
#include "tests/leader/clock_document.h"
#include "tests/leader/recording_sink.h"
#include "tests/test_paths.h"

namespace strata {
namespace {

using test::RecordingSink;

ServerConfig config_with(const std::string& dtype, const std::string& policy, int64_t memory_mib) {
  ServerConfig config = load_server_config(test::source_path("configs/smollm2-cpu.yaml"));
  config.model.path = test::smollm2_gguf_path();
  config.kv_cache.dtype = dtype;
  config.kv_cache.block_size = 32;
  config.kv_cache.memory_mib = memory_mib;
  config.kv_cache.policy = policy;
  return config;
}

// The real model behind an engine, with the prefix cache on or off, serving greedy requests one after the other.
class SequentialEngine {
 public:
  SequentialEngine(const ServerConfig& config, bool prefix_caching)
      : rt_(make_runtime(config)),
        metrics_(8192, layer_metrics()),
        engine_(*rt_->executor, *rt_->cache, *rt_->tokenizer, rt_->weights.config, metrics_,
                options(config, *rt_, prefix_caching)) {}

  std::vector<int32_t> encode(const std::string& text) const { return rt_->tokenizer->encode(text, false); }

  // Runs one request to its end: its tokens; *cached gets its cached prompt tokens.
  std::vector<int32_t> generate(std::vector<int32_t> prompt, int max_tokens, bool ignore_eos, int* cached) {
    auto sink = std::make_shared<RecordingSink>();
    GenerationRequest r;
    r.id = "sequential";
    r.prompt_ids = std::move(prompt);
    r.sampling.temperature = 0.0f;
    r.sampling.max_tokens = max_tokens;
    r.sampling.ignore_eos = ignore_eos;
    r.sink = sink;
    engine_.submit(std::move(r));
    engine_.run_until_idle();
    EXPECT_TRUE(sink->finished) << sink->error;
    *cached = sink->usage.cached_prompt_tokens;
    return sink->tokens[0];
  }

  void expect_every_block_back() const {
    const int64_t cached_slots = rt_->cache->n_cached_blocks() * rt_->cache->n_layers();
    EXPECT_EQ(rt_->pool->n_free() + cached_slots, rt_->pool->n_total()) << "every block in the pool or the cache";
  }
  std::string metrics() const { return metrics_.render(); }

 private:
  static EngineOptions options(const ServerConfig& config, const RankRuntime& rt, bool prefix_caching) {
    EngineOptions o = engine_options(config, rt);
    if (!prefix_caching) o.prefix_cache.reset();
    return o;
  }

  std::unique_ptr<RankRuntime> rt_;
  ServerMetrics metrics_;
  Engine engine_;
};

struct Outcome {
  std::vector<std::vector<int32_t>> tokens;  // per request
  std::vector<int> cached;                   // usage.prompt_tokens_details.cached_tokens per request
  std::string metrics;
};

// The questions one after the other (each after the previous has finished), greedy, 12 tokens each.
Outcome ask(const ServerConfig& config, bool prefix_caching) {
  SequentialEngine engine(config, prefix_caching);
  Outcome out;
  for (const char* question : {" Question: what keeps a clock's time?", " Question: who built the first clock?",
                               " Question: why do pendulums swing?"}) {
    out.cached.push_back(0);
    out.tokens.push_back(
        engine.generate(engine.encode(test::clock_document() + question), 12, false, &out.cached.back()));
  }
  engine.expect_every_block_back();
  out.metrics = engine.metrics();
  return out;
}

void expect_same_with_and_without(const std::string& dtype, const std::string& policy) {
  SCOPED_TRACE(dtype + ", " + policy);
  const ServerConfig config = config_with(dtype, policy, 64);
  const Outcome off = ask(config, false);
  const Outcome on = ask(config, true);
  EXPECT_EQ(on.tokens, off.tokens);
  EXPECT_EQ(on.cached[0], 0);
  EXPECT_GT(on.cached[1], 0) << "the second question finds the document cached";
  EXPECT_EQ(on.cached[2], on.cached[1]);
  EXPECT_EQ(off.cached, (std::vector<int>{0, 0, 0}));
  EXPECT_NE(on.metrics.find("strata_prefix_cache_hits_total " + std::to_string(on.cached[1] + on.cached[2])),
            std::string::npos)
      << on.metrics;
}

TEST(PrefixCacheEngine, FullOnF32) { expect_same_with_and_without("f32", "full"); }
TEST(PrefixCacheEngine, SnapKvOnF32) { expect_same_with_and_without("f32", "snapkv:budget=64,window=8"); }
TEST(PrefixCacheEngine, FullOnInt4) { expect_same_with_and_without("int4", "full"); }
TEST(PrefixCacheEngine, SnapKvOnInt8) { expect_same_with_and_without("int8", "snapkv:budget=64,window=8"); }
TEST(PrefixCacheEngine, PyramidKv) { expect_same_with_and_without("f32", "pyramidkv:budget=64,window=8"); }
TEST(PrefixCacheEngine, SimLayerKv) { expect_same_with_and_without("f32", "simlayerkv:window=40,n_init=4,threshold=0"); }
TEST(PrefixCacheEngine, RollingStreaming) { expect_same_with_and_without("f32", "streaming:budget=64,mode=rolling"); }
TEST(PrefixCacheEngine, SpindleKv) { expect_same_with_and_without("f32", "spindlekv:ratio=0.3,window=8"); }

struct Turns {
  std::vector<std::vector<int32_t>> answers;
  std::vector<int> cached;  // cached prompt tokens per turn
  int n_first_prompt = 0;
};

// Two turns, greedy, 80 tokens each: the second prompt is the first prompt, its answer and a follow-up.
Turns two_turns(const ServerConfig& config, bool prefix_caching) {
  SequentialEngine engine(config, prefix_caching);
  std::vector<int32_t> prompt = engine.encode(test::clock_document().substr(0, 400));
  Turns turns;
  turns.n_first_prompt = int(prompt.size());
  for (int turn = 0; turn < 2; ++turn) {
    turns.cached.push_back(0);
    turns.answers.push_back(engine.generate(prompt, 80, true, &turns.cached.back()));
    prompt.insert(prompt.end(), turns.answers.back().begin(), turns.answers.back().end());
    const std::vector<int32_t> more = engine.encode(" And then?");
    prompt.insert(prompt.end(), more.begin(), more.end());
  }
  engine.expect_every_block_back();
  return turns;
}

// A chat's next turn: with `full` the blocks of the first answer were published as it was generated, so the hit
// reaches into them; with SnapKV (which rewrites its entries) or an int4 pool (whose decode steps read quantized
// entries) only the prompt's blocks were. Outputs equal the cache off.
void expect_answers_reused(const std::string& dtype, const std::string& policy, bool answer_cached) {
  SCOPED_TRACE(dtype + ", " + policy);
  const ServerConfig config = config_with(dtype, policy, 64);
  const Turns off = two_turns(config, false);
  const Turns on = two_turns(config, true);
  EXPECT_EQ(on.answers, off.answers);
  const int block = config.kv_cache.block_size;
  if (answer_cached) {
    // The answer's last token is never fed back: the cached blocks end before it.
    EXPECT_EQ(on.cached[1], (on.n_first_prompt + 80 - 1) / block * block);
  } else {
    EXPECT_GT(on.cached[1], 0);
    EXPECT_LE(on.cached[1], on.n_first_prompt / block * block);
  }
}

TEST(PrefixCacheEngine, AChatsNextTurnFindsItsAnswerCached) {
  expect_answers_reused("f32", "full", true);
  expect_answers_reused("int4", "full", false);
  expect_answers_reused("f32", "snapkv:budget=64,window=8", false);
}

// Policies that read every prompt row (H2O, D2O) take no hit, but publish; PoD neither takes nor publishes. Their
// outputs stay what they are without the cache.
void expect_no_hits(const std::string& policy, const std::string& pod_blocks = "") {
  SCOPED_TRACE(policy);
  ServerConfig config = config_with("f32", policy, 64);
  config.kv_cache.pod_blocks = pod_blocks;
  const Outcome off = ask(config, false);
  const Outcome on = ask(config, true);
  EXPECT_EQ(on.tokens, off.tokens);
  EXPECT_EQ(on.cached, (std::vector<int>{0, 0, 0}));
}

TEST(PrefixCacheEngine, H2oAndD2oTakeNoHits) {
  expect_no_hits("h2o:budget=64");
  expect_no_hits("d2o");
}

TEST(PrefixCacheEngine, PodBypassesTheCache) {
  expect_no_hits("pod", test::source_path("configs/smollm2-pod-blocks.txt"));
}

// A pool that holds one request at a time (16 MiB: some 360 tokens of SmolLM2's KV, 46 KB a token): each new
// document needs the blocks that cache the one before, which are evicted for it, and every request is served.
TEST(PrefixCacheEngine, ACachedPrefixGivesWayWhenThePoolIsShort) {
  const ServerConfig config = config_with("f32", "full", 16);
  const std::unique_ptr<RankRuntime> rt = make_runtime(config);
  ServerMetrics metrics(8192, layer_metrics());
  Engine engine(*rt->executor, *rt->cache, *rt->tokenizer, rt->weights.config, metrics, engine_options(config, *rt));
  for (int i = 0; i < 3; ++i) {
    auto sink = std::make_shared<RecordingSink>();
    GenerationRequest r;
    r.id = "short";
    r.prompt_ids = rt->tokenizer->encode(test::clock_document().substr(size_t(i) * 100), false);
    r.sampling.temperature = 0.0f;
    r.sampling.max_tokens = 8;
    r.sink = sink;
    engine.submit(std::move(r));
    engine.run_until_idle();
    EXPECT_TRUE(sink->finished) << "request " << i << ": " << sink->error;
    EXPECT_EQ(sink->usage.cached_prompt_tokens, 0);
  }
  const int64_t cached_slots = rt->cache->n_cached_blocks() * rt->cache->n_layers();
  EXPECT_EQ(rt->pool->n_free() + cached_slots, rt->pool->n_total());
  EXPECT_LT(cached_slots, rt->pool->n_total()) << "the earlier documents were evicted";
}

// Six requests on one document at once, in a pool that cannot hold them all: some are preempted and recomputed
// (starting from cached blocks again), and each still generates what it generates with the cache off.
TEST(PrefixCacheEngine, PreemptedSequencesComeBackToTheSameOutput) {
  auto run = [](bool prefix_caching, int64_t* preemptions) {
    const ServerConfig config = config_with("f32", "full", 24);
    const std::unique_ptr<RankRuntime> rt = make_runtime(config);
    ServerMetrics metrics(8192, layer_metrics());
    EngineOptions options = engine_options(config, *rt);
    if (!prefix_caching) options.prefix_cache.reset();
    Engine engine(*rt->executor, *rt->cache, *rt->tokenizer, rt->weights.config, metrics, options);
    std::vector<std::shared_ptr<RecordingSink>> sinks;
    for (int i = 0; i < 6; ++i) {
      sinks.push_back(std::make_shared<RecordingSink>());
      GenerationRequest r;
      r.id = "crowd";
      r.prompt_ids = rt->tokenizer->encode(
          test::clock_document().substr(0, 600) + " Question " + std::to_string(i) + ":", false);
      r.sampling.temperature = 0.0f;
      r.sampling.max_tokens = 48;
      r.sampling.ignore_eos = true;
      r.sink = sinks.back();
      engine.submit(std::move(r));
    }
    engine.run_until_idle();
    std::vector<std::vector<int32_t>> out;
    for (const auto& s : sinks) {
      EXPECT_TRUE(s->finished) << s->error;
      out.push_back(s->tokens[0]);
    }
    const std::string text = metrics.render();
    const std::string name = "\nstrata_preemptions_total ";
    const size_t at = text.find(name);
    *preemptions = at == std::string::npos ? -1 : std::stoll(text.substr(at + name.size()));
    return out;
  };
  int64_t preempted_off = 0, preempted_on = 0;
  const auto off = run(false, &preempted_off);
  const auto on = run(true, &preempted_on);
  EXPECT_EQ(on, off);
  EXPECT_GT(preempted_on, 0) << "the pool should have been too small for all six (measured: 3 preemptions)";
  EXPECT_GT(preempted_off, 0);
}

}  // namespace
}  // namespace strata
