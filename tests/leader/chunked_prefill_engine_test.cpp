// The engine with kv_cache.prefill_compression chunked, on the real model in-process: a request batched with
// others, or joining a running batch, gets what it gets alone under a policy that compresses while its prompt is
// prefilled; preemption by recompute still gives the same output; a prompt four times what the pool holds per
// layer is served under each bounded policy and refused under `full` with its length and the pool's size; under
// auto each request prefills as its policies allow.
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
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

ServerConfig chunked_config(int64_t memory_mib, const std::string& policy, int chunk) {
  ServerConfig config = load_server_config(test::source_path("configs/smollm2-cpu.yaml"));
  config.model.path = test::smollm2_gguf_path();
  config.kv_cache.memory_mib = memory_mib;
  config.kv_cache.policy = policy;
  config.kv_cache.prefill_compression = "chunked";
  config.kv_cache.prefill_chunk = chunk;
  config.kv_cache.prefix_caching = false;
  return config;
}

GenerationRequest request(const std::vector<int32_t>& prompt, int max_tokens, std::shared_ptr<RecordingSink> sink) {
  GenerationRequest r;
  r.id = "test";
  r.prompt_ids = prompt;
  r.sampling.temperature = 0.0f;
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;
  r.sink = std::move(sink);
  return r;
}

// n prompt token ids, different for every seed.
std::vector<int32_t> prompt_of(int n, int seed) {
  std::vector<int32_t> ids = {1};
  for (int i = 1; i < n; ++i) ids.push_back(300 + (i * 37 + seed * 101) % 9000);
  return ids;
}

struct ServedEngine {
  std::unique_ptr<RankRuntime> rt;
  ServerMetrics metrics{8192, layer_metrics()};
  std::unique_ptr<Engine> engine;

  ServedEngine(const ServerConfig& config, int max_batch_tokens = 512, double watermark = 0.01)
      : rt(make_runtime(config)) {
    EngineOptions options = engine_options(config, *rt);
    options.limits.max_batch_tokens = max_batch_tokens;
    options.limits.watermark = watermark;
    engine = std::make_unique<Engine>(*rt->executor, *rt->cache, *rt->tokenizer, rt->weights.config, metrics,
                                      std::move(options));
  }

  std::vector<std::vector<int32_t>> generate(const std::vector<std::vector<int32_t>>& prompts, int max_tokens) {
    std::vector<std::shared_ptr<RecordingSink>> sinks;
    for (const auto& p : prompts) {
      sinks.push_back(std::make_shared<RecordingSink>());
      engine->submit(request(p, max_tokens, sinks.back()));
    }
    engine->run_until_idle();
    std::vector<std::vector<int32_t>> out;
    for (const auto& s : sinks) {
      EXPECT_TRUE(s->finished) << s->error;
      out.push_back(s->tokens[0]);
    }
    EXPECT_EQ(rt->pool->n_free(), rt->pool->n_total()) << "every block is back in the pool";
    return out;
  }
};

const std::vector<std::vector<int32_t>> kPrompts = {prompt_of(150, 1), prompt_of(97, 2), prompt_of(180, 3),
                                                    prompt_of(40, 4)};

// kPrompts batched, and cut into steps of 20 tokens (pieces other than the compression chunks, joining
// mid-prefill), get what each gets alone.
void expect_batched_as_alone(const ServerConfig& config) {
  ServedEngine run(config);
  std::vector<std::vector<int32_t>> alone;
  for (const auto& p : kPrompts) alone.push_back(run.generate({p}, 6)[0]);
  EXPECT_EQ(run.generate(kPrompts, 6), alone);
  ServedEngine small_steps(config, /*max_batch_tokens=*/20);
  EXPECT_EQ(small_steps.generate(kPrompts, 6), alone);
}

TEST(ChunkedPrefillEngine, BatchedRequestsGetWhatEachGetsAlone) {
  expect_batched_as_alone(chunked_config(64, "h2o:budget=24,window=4", 32));
}

TEST(ChunkedPrefillEngine, SnapKvBatchedGetsWhatEachGetsAlone) {
  // Every chunk that ends before its prompt's end carries the prompt's last 4 tokens as scoring rows.
  expect_batched_as_alone(chunked_config(64, "snapkv:budget=24,window=4", 32));
}

TEST(ChunkedPrefillEngine, ExpectedAttentionBatchedGetsWhatEachGetsAlone) {
  // A policy that reads the cache's keys and values at every compression point (through the pool's backend) and
  // the query moments the forward pass adds up chunk by chunk.
  expect_batched_as_alone(chunked_config(64, "expected_attention:budget=40", 32));
}

TEST(ChunkedPrefillEngine, KvzipBatchedGetsWhatEachGetsAlone) {
  // Every chunk that ends before its prompt's end carries its own reconstruction as scoring rows, whose attention
  // maxima score it.
  expect_batched_as_alone(chunked_config(64, "kvzip:budget=40", 32));
}

// A 16-bit pool (kv_cache.dtype bf16 | f16): the same equalities under policies whose ops read and rewrite its
// entries: compaction (H2O), key forms (Expected Attention), D2O's merges, SpindleKV's codebooks and PoD's paired
// blocks (the last three prefill whole: they have no chunked form).
TEST(ChunkedPrefillEngine, HalfPoolsBatchedGetWhatEachGetsAlone) {
  const std::pair<std::string, std::string> cases[] = {
      {"h2o:budget=24,window=4", "chunked"},
      {"expected_attention:budget=40", "chunked"},
      {"d2o:hh_ratio=0.1,recent_ratio=0.1", "end"},
      {"spindlekv", "end"},
      {"pod", "end"}};
  for (const std::string dtype : {"bf16", "f16"}) {
    for (const auto& [policy, mode] : cases) {
      if (dtype == "f16" && policy != "h2o:budget=24,window=4") continue;  // f16 and bf16 share every op
      ServerConfig config = chunked_config(64, policy, 32);
      config.kv_cache.dtype = dtype;
      config.kv_cache.prefill_compression = mode;
      if (policy == "pod") config.kv_cache.pod_blocks = test::source_path("configs/smollm2-pod-blocks.txt");
      SCOPED_TRACE(dtype + ", " + policy);
      expect_batched_as_alone(config);
    }
  }
}

// kv_cache.prefill_compression auto: in one batch, a sequence under SnapKV (which has the chunked form) prefills
// as a chunked server prefills it, and one whose request asks for SimLayerKV (which has not) as an end server does.
TEST(ChunkedPrefillEngine, AutoRunsEachRequestAsItsPoliciesAllow) {
  const std::string snapkv = "snapkv:budget=24,window=4";
  const std::vector<std::optional<PolicySpec>> policies = {std::nullopt, parse_policy_spec("simlayerkv"),
                                                           std::nullopt, parse_policy_spec("simlayerkv")};
  const auto serve = [&](const std::string& mode, const std::vector<size_t>& which) {
    ServerConfig config = chunked_config(64, snapkv, 32);
    config.kv_cache.prefill_compression = mode;
    ServedEngine run(config);
    std::vector<std::shared_ptr<RecordingSink>> sinks;
    for (size_t i : which) {
      sinks.push_back(std::make_shared<RecordingSink>());
      GenerationRequest r = request(kPrompts[i], 6, sinks.back());
      r.kv_policy = policies[i];
      run.engine->submit(std::move(r));
    }
    run.engine->run_until_idle();
    std::vector<std::vector<int32_t>> out;
    for (const auto& sink : sinks) {
      EXPECT_TRUE(sink->finished) << mode << ": " << sink->error;
      out.push_back(sink->tokens.empty() ? std::vector<int32_t>{} : sink->tokens[0]);
    }
    return out;
  };
  const std::vector<std::vector<int32_t>> together = serve("auto", {0, 1, 2, 3});
  const std::vector<std::vector<int32_t>> chunked = serve("chunked", {0, 2});
  const std::vector<std::vector<int32_t>> end = serve("end", {0, 1, 2, 3});
  EXPECT_EQ(together[0], chunked[0]);
  EXPECT_EQ(together[2], chunked[1]);
  EXPECT_EQ(together[1], end[1]);
  EXPECT_EQ(together[3], end[3]);
  EXPECT_TRUE(chunked[0] != end[0] || chunked[1] != end[2])
      << "SnapKV's chunked and end answers differ on one of these prompts, so the checks above tell the modes apart";
}

TEST(ChunkedPrefillEngine, PreemptionByRecomputeGivesTheSameOutput) {
  // The engine test's scenario (tests/leader/engine_test.cpp) in chunked mode: a 4 MiB pool, too small for two
  // whole sequences, so the newest running ones are preempted and recomputed.
  const ServerConfig config = chunked_config(4, "full", 16);
  ServedEngine reference(chunked_config(64, "full", 16));
  const std::vector<std::vector<int32_t>> prompts = {prompt_of(20, 5), prompt_of(22, 6), prompt_of(21, 7),
                                                     prompt_of(23, 8)};
  const auto alone = reference.generate(prompts, 20);
  ServedEngine run(config, 512, 0.0);
  EXPECT_EQ(run.generate(prompts, 20), alone);
  EXPECT_EQ(run.metrics.render().find("strata_preemptions_total 0"), std::string::npos) << "none was preempted";
}

TEST(ChunkedPrefillEngine, APromptFourTimesThePoolIsServedUnderEachBoundedPolicy) {
  // 8 MiB: 341 blocks of 16 tokens, 11 a layer: 176 tokens a layer. The prompt has 720.
  const std::vector<int32_t> prompt = prompt_of(720, 9);
  // KVzip's scoring rows repeat the chunk (and 27 tokens of request): budget + 2 chunks + 27 must fit, so its
  // chunks are of 32.
  const std::vector<std::pair<std::string, int>> runs = {
      {"streaming:budget=32", 64},          {"h2o:budget=32", 64},   {"snapkv:budget=32,window=8", 64},
      {"pyramidkv:budget=32", 64},          {"kvzip:budget=32", 32}, {"expected_attention:budget=32", 64}};
  for (const auto& [policy, chunk] : runs) {
    ServedEngine run(chunked_config(8, policy, chunk));
    ASSERT_LT(run.rt->pool->n_total() / 30 * 16 * 4, int64_t(prompt.size()) + 64) << "the pool is that small";
    EXPECT_EQ(run.generate({prompt}, 4)[0].size(), 4u) << policy;
  }
  ServedEngine full(chunked_config(8, "full", 64));
  auto sink = std::make_shared<RecordingSink>();
  try {
    full.engine->submit(request(prompt, 4, sink));
    FAIL() << "full needs the whole prompt in every layer";
  } catch (const std::invalid_argument& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("720 tokens"), std::string::npos) << message;
    EXPECT_NE(message.find("tokens a layer"), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace strata
