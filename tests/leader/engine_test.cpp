// The leader's engine on the real model, in-process: continuous batching must not change what a request gets,
// preemption (recompute) must not change it either, a client that goes away frees its blocks, and every block
// comes back to the pool when the work is done.
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include <gtest/gtest.h>

#include "daemon/runtime.h"
#include "leader/engine.h"
#include "leader/metrics.h"
#include "tests/leader/recording_sink.h"
#include "tests/test_paths.h"

namespace strata {
namespace {

using test::RecordingSink;

class EngineTest : public ::testing::Test {
 protected:
  static std::unique_ptr<RankRuntime> make(int64_t memory_mib, int max_batch_tokens = 512) {
    ServerConfig config = load_server_config(test::source_path("configs/smollm2-cpu.yaml"));
    config.model.path = test::smollm2_gguf_path();
    config.kv_cache.memory_mib = memory_mib;
    config.engine.max_batch_tokens = max_batch_tokens;
    return make_runtime(config);
  }

  static GenerationRequest request(const RankRuntime& rt, const std::string& prompt, int max_tokens,
                                   std::shared_ptr<RecordingSink> sink) {
    GenerationRequest r;
    r.id = "test";
    r.prompt_ids = rt.tokenizer->encode(prompt, false);
    r.sampling.temperature = 0.0f;
    r.sampling.max_tokens = max_tokens;
    r.sink = std::move(sink);
    return r;
  }

  // Runs each prompt alone and returns the token ids it generates.
  static std::vector<std::vector<int32_t>> run_alone(RankRuntime& rt, const std::vector<std::string>& prompts,
                                                     int max_tokens) {
    std::vector<std::vector<int32_t>> out;
    for (const std::string& p : prompts) {
      ServerMetrics metrics(8192, layer_metrics());
      Engine engine(*rt.executor, *rt.cache, *rt.tokenizer, rt.weights.config, metrics, EngineOptions{});
      auto sink = std::make_shared<RecordingSink>();
      engine.submit(request(rt, p, max_tokens, sink));
      engine.run_until_idle();
      EXPECT_TRUE(sink->finished) << sink->error;
      out.push_back(sink->tokens[0]);
    }
    return out;
  }
};

const std::vector<std::string> kPrompts = {
    "The capital of France is",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "def fibonacci(n):\n    ",
    "List three colours:",
};

TEST_F(EngineTest, BatchedRequestsGetWhatEachGetsAlone) {
  auto rt = make(64);
  const auto alone = run_alone(*rt, kPrompts, 8);

  ServerMetrics metrics(8192, layer_metrics());
  Engine engine(*rt->executor, *rt->cache, *rt->tokenizer, rt->weights.config, metrics, EngineOptions{});
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  for (const std::string& p : kPrompts) {
    sinks.push_back(std::make_shared<RecordingSink>());
    engine.submit(request(*rt, p, 8, sinks.back()));
  }
  engine.run_until_idle();
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    ASSERT_TRUE(sinks[i]->finished) << sinks[i]->error;
    EXPECT_EQ(sinks[i]->tokens[0], alone[i]) << "prompt " << i;
    EXPECT_EQ(sinks[i]->usage.completion_tokens, int(sinks[i]->tokens[0].size()));
  }
  EXPECT_EQ(rt->pool->n_free(), rt->pool->n_total()) << "every block is back in the pool";
}

TEST_F(EngineTest, RequestJoiningARunningBatchDoesNotDisturbIt) {
  auto rt = make(64, /*max_batch_tokens=*/16);  // small steps: the second request arrives mid-prefill of the first
  const auto alone = run_alone(*rt, {kPrompts[1], kPrompts[0]}, 6);
  ServerMetrics metrics(8192, layer_metrics());
  EngineOptions options;
  options.limits.max_batch_tokens = 16;
  Engine engine(*rt->executor, *rt->cache, *rt->tokenizer, rt->weights.config, metrics, options);
  engine.start();
  auto first = std::make_shared<RecordingSink>(), second = std::make_shared<RecordingSink>();
  engine.submit(request(*rt, kPrompts[1], 6, first));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  engine.submit(request(*rt, kPrompts[0], 6, second));
  for (int i = 0; i < 600 && !(first->finished && second->finished); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  engine.stop();
  ASSERT_TRUE(first->finished && second->finished);
  EXPECT_EQ(first->tokens[0], alone[0]);
  EXPECT_EQ(second->tokens[0], alone[1]);
}

TEST_F(EngineTest, PreemptionByRecomputeGivesTheSameOutput) {
  // A 4 MiB pool has 170 blocks of 16 tokens: two of these sequences (about 20 prompt + 20 generated tokens,
  // 3 blocks in each of 30 layers) already need 180, so the newest running ones are preempted and recomputed.
  auto reference_rt = make(64);
  const std::vector<std::string> prompts = {kPrompts[1], kPrompts[1] + " sang", kPrompts[1] + " fished",
                                            kPrompts[1] + " slept"};
  const auto alone = run_alone(*reference_rt, prompts, 20);
  reference_rt.reset();

  auto rt = make(4);
  ASSERT_LT(rt->pool->n_total(), 2 * 30 * 3) << "the pool must be too small for two whole sequences";
  ServerMetrics metrics(8192, layer_metrics());
  EngineOptions options;
  options.limits.watermark = 0.0;
  Engine engine(*rt->executor, *rt->cache, *rt->tokenizer, rt->weights.config, metrics, options);
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  for (const std::string& p : prompts) {
    sinks.push_back(std::make_shared<RecordingSink>());
    engine.submit(request(*rt, p, 20, sinks.back()));
  }
  engine.run_until_idle();
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_TRUE(sinks[i]->finished) << sinks[i]->error;
    EXPECT_EQ(sinks[i]->tokens[0], alone[i]) << "prompt " << i;
  }
  const std::string text = metrics.render();
  EXPECT_EQ(text.find("strata_preemptions_total 0"), std::string::npos) << "some sequence was preempted";
  EXPECT_EQ(rt->pool->n_free(), rt->pool->n_total());
}

TEST_F(EngineTest, CancelledRequestFreesItsBlocksAndOthersFinish) {
  auto rt = make(64);
  ServerMetrics metrics(8192, layer_metrics());
  Engine engine(*rt->executor, *rt->cache, *rt->tokenizer, rt->weights.config, metrics, EngineOptions{});
  auto gone = std::make_shared<RecordingSink>();
  gone->cancel_after_deltas = 2;
  auto stays = std::make_shared<RecordingSink>();
  engine.submit(request(*rt, kPrompts[1], 50, gone));
  engine.submit(request(*rt, kPrompts[0], 6, stays));
  engine.run_until_idle();
  EXPECT_FALSE(gone->finished) << "a cancelled request gets no more events";
  EXPECT_LE(gone->n_deltas, 3);
  EXPECT_TRUE(stays->finished);
  EXPECT_EQ(rt->pool->n_free(), rt->pool->n_total());
}

TEST_F(EngineTest, FinishReasonsAndStopStrings) {
  auto rt = make(64);
  ServerMetrics metrics(8192, layer_metrics());
  Engine engine(*rt->executor, *rt->cache, *rt->tokenizer, rt->weights.config, metrics, EngineOptions{});
  // Greedy "The capital of France is" continues " Paris..."; stopping at "is" cuts before it.
  auto length = std::make_shared<RecordingSink>();
  engine.submit(request(*rt, kPrompts[0], 3, length));
  auto stopped = std::make_shared<RecordingSink>();
  GenerationRequest r = request(*rt, kPrompts[0], 20, stopped);
  r.sampling.stop = {"."};
  engine.submit(std::move(r));
  engine.run_until_idle();
  EXPECT_EQ(length->finish_reason[0], "length");
  EXPECT_EQ(length->usage.completion_tokens, 3);
  EXPECT_EQ(stopped->finish_reason[0], "stop");
  EXPECT_EQ(stopped->text[0].find('.'), std::string::npos) << stopped->text[0];
  EXPECT_FALSE(stopped->text[0].empty());
}

TEST_F(EngineTest, SeveralChoicesAndSeeds) {
  auto rt = make(64);
  ServerMetrics metrics(8192, layer_metrics());
  Engine engine(*rt->executor, *rt->cache, *rt->tokenizer, rt->weights.config, metrics, EngineOptions{});
  auto a = std::make_shared<RecordingSink>(), b = std::make_shared<RecordingSink>();
  for (auto& sink : {a, b}) {
    GenerationRequest r = request(*rt, kPrompts[1], 8, sink);
    r.sampling.temperature = 1.0f;
    r.sampling.seed = 42;
    r.n = 2;
    engine.submit(std::move(r));
  }
  engine.run_until_idle();
  ASSERT_TRUE(a->finished && b->finished);
  EXPECT_EQ(a->tokens[0], b->tokens[0]) << "same seed, same output";
  EXPECT_EQ(a->tokens[1], b->tokens[1]);
  EXPECT_NE(a->tokens[0], a->tokens[1]) << "the choices of one request differ";
  EXPECT_EQ(a->usage.completion_tokens, int(a->tokens[0].size() + a->tokens[1].size()));
}

TEST_F(EngineTest, PromptsTheEngineCannotServeAreRefused) {
  auto rt = make(1);
  ServerMetrics metrics(8192, layer_metrics());
  Engine engine(*rt->executor, *rt->cache, *rt->tokenizer, rt->weights.config, metrics, EngineOptions{});
  auto sink = std::make_shared<RecordingSink>();
  GenerationRequest too_long = request(*rt, kPrompts[0], 4, sink);
  too_long.prompt_ids.assign(8192, 100);
  EXPECT_THROW(engine.submit(too_long), std::invalid_argument);
  GenerationRequest beyond_pool = request(*rt, kPrompts[0], 4, sink);
  beyond_pool.prompt_ids.assign(2000, 100);  // fits the context, not a 1 MiB pool
  EXPECT_THROW(engine.submit(beyond_pool), std::invalid_argument);
}

// A full queue refuses a request with its reason, which the front end turns into its status (routing/).
TEST_F(EngineTest, AFullQueueRefusesWithItsReason) {
  auto rt = make(64);
  ServerMetrics metrics(8192, layer_metrics());
  EngineOptions options;
  options.max_waiting = 1;
  Engine engine(*rt->executor, *rt->cache, *rt->tokenizer, rt->weights.config, metrics, options);
  engine.submit(request(*rt, kPrompts[0], 2, std::make_shared<RecordingSink>()));
  try {
    engine.submit(request(*rt, kPrompts[1], 2, std::make_shared<RecordingSink>()));
    ADD_FAILURE() << "a second request joined a queue of one";
  } catch (const SubmitRefused& e) {
    EXPECT_EQ(e.why, Refusal::queue_full) << e.what();
    EXPECT_NE(std::string(e.what()).find("(1 sequences waiting)"), std::string::npos) << e.what();
  }
  engine.run_until_idle();
  EXPECT_TRUE(engine.idle());
}

// A drain refuses new requests and lets those submitted finish: the queued one too, not only the running one.
TEST_F(EngineTest, ADrainFinishesWhatWasSubmittedAndRefusesTheRest) {
  auto rt = make(64);
  ServerMetrics metrics(8192, layer_metrics());
  EngineOptions options;
  options.limits.max_running = 1;  // the second request waits in the queue
  Engine engine(*rt->executor, *rt->cache, *rt->tokenizer, rt->weights.config, metrics, options);
  auto running = std::make_shared<RecordingSink>();
  auto queued = std::make_shared<RecordingSink>();
  engine.submit(request(*rt, kPrompts[0], 6, running));
  engine.submit(request(*rt, kPrompts[3], 6, queued));
  EXPECT_FALSE(engine.idle());
  engine.drain();
  auto late = std::make_shared<RecordingSink>();
  try {
    engine.submit(request(*rt, kPrompts[1], 6, late));
    ADD_FAILURE() << "a draining engine queued a request";
  } catch (const SubmitRefused& e) {
    EXPECT_EQ(e.why, Refusal::draining) << e.what();
  }
  engine.run_until_idle();
  EXPECT_TRUE(running->finished) << running->error;
  EXPECT_TRUE(queued->finished) << queued->error;
  EXPECT_EQ(queued->tokens[0].size(), 6u);
  EXPECT_TRUE(engine.idle());
  EXPECT_EQ(rt->pool->n_free() + rt->cache->n_cached_blocks() * rt->cache->n_layers(), rt->pool->n_total());
}

}  // namespace
}  // namespace strata
