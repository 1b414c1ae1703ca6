// Structured output in the engine, on the real model: a constrained request's every token is one its grammar
// allows (checked with an independent matcher over the token bytes), its choice ends as soon as the document is
// complete, and it shares batches (and preemptions) with free requests without changing what they get.
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "daemon/runtime.h"
#include "grammar/grammar_matcher.h"
#include "grammar/json_schema.h"
#include "leader/engine.h"
#include "leader/metrics.h"
#include "tests/leader/recording_sink.h"
#include "tests/test_paths.h"

namespace strata {
namespace {

using test::RecordingSink;

std::unique_ptr<RankRuntime> make_runtime_with(int64_t memory_mib) {
  ServerConfig config = load_server_config(test::source_path("configs/smollm2-cpu.yaml"));
  config.model.path = test::smollm2_gguf_path();
  config.kv_cache.memory_mib = memory_mib;
  return make_runtime(config);
}

std::shared_ptr<const grammar::Grammar> schema(const char* text) {
  return grammar::compile_json_schema(nlohmann::ordered_json::parse(text));
}

GenerationRequest request(const RankRuntime& rt, const std::string& prompt, int max_tokens,
                          std::shared_ptr<RecordingSink> sink, std::shared_ptr<const grammar::Grammar> grammar) {
  GenerationRequest r;
  r.id = "test";
  r.prompt_ids = rt.tokenizer->encode(prompt, false);
  r.sampling.temperature = 0.0f;
  r.sampling.max_tokens = max_tokens;
  r.grammar = std::move(grammar);
  r.sink = std::move(sink);
  return r;
}

// The generated tokens' bytes, fed to a matcher of the grammar one by one: each must be allowed, and the whole
// must be a complete document.
void expect_a_complete_document(const RankRuntime& rt, const std::shared_ptr<const grammar::Grammar>& grammar,
                                const std::vector<int32_t>& tokens) {
  grammar::GrammarMatcher matcher(grammar);
  for (int32_t id : tokens) {
    ASSERT_TRUE(matcher.advance(rt.tokenizer->token_bytes(id))) << "token " << id << " is outside the grammar";
  }
  EXPECT_TRUE(matcher.is_complete());
}

constexpr const char* kPerson = R"({"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "pets": {"type": "array", "items": {"enum": ["cat", "dog"]}, "maxItems": 2}}, "required": ["name", "age"]})";

TEST(StructuredOutputEngine, ConstrainedChoicesEndWithTheirDocument) {
  auto rt = make_runtime_with(64);
  ServerMetrics metrics(8192, layer_metrics());
  Engine engine(*rt->executor, *rt->cache, *rt->tokenizer, rt->weights.config, metrics, EngineOptions{});
  const auto person = schema(kPerson);
  const auto answer = schema(R"({"enum": ["yes", "no"]})");
  auto greedy = std::make_shared<RecordingSink>(), sampled = std::make_shared<RecordingSink>(),
       short_answer = std::make_shared<RecordingSink>();
  engine.submit(request(*rt, "A person as JSON:", 200, greedy, person));
  GenerationRequest r = request(*rt, "A person as JSON:", 200, sampled, person);
  r.sampling.temperature = 1.0f;
  r.sampling.seed = 3;
  r.n = 3;
  engine.submit(std::move(r));
  engine.submit(request(*rt, "Is the sky blue? Answer:", 20, short_answer, answer));
  engine.run_until_idle();

  for (auto* sink : {greedy.get(), sampled.get()}) {
    ASSERT_TRUE(sink->finished) << sink->error;
    for (const auto& [choice, tokens] : sink->tokens) {
      EXPECT_EQ(sink->finish_reason[choice], "stop") << sink->text[choice];
      expect_a_complete_document(*rt, person, tokens);
      const nlohmann::json doc = nlohmann::json::parse(sink->text[choice]);
      EXPECT_LE(doc.at("age").get<int>(), 120);
    }
  }
  // The document's end is the choice's end: no end-of-sequence token is needed after `"yes"`.
  ASSERT_TRUE(short_answer->finished);
  EXPECT_TRUE(short_answer->text[0] == "\"yes\"" || short_answer->text[0] == "\"no\"") << short_answer->text[0];
  expect_a_complete_document(*rt, answer, short_answer->tokens[0]);
  EXPECT_EQ(rt->pool->n_free(), rt->pool->n_total());
}

TEST(StructuredOutputEngine, FreeRequestsBesideConstrainedOnesAndPreemptionsGetWhatTheyGetAlone) {
  const std::string free_prompt = "Once upon a time, in a small village by the sea, there lived an old fisherman who";
  const auto person = schema(kPerson);
  std::vector<int32_t> free_alone, constrained_alone;
  {
    auto rt = make_runtime_with(64);
    for (auto* out : {&free_alone, &constrained_alone}) {
      ServerMetrics metrics(8192, layer_metrics());
      Engine engine(*rt->executor, *rt->cache, *rt->tokenizer, rt->weights.config, metrics, EngineOptions{});
      auto sink = std::make_shared<RecordingSink>();
      const bool free = out == &free_alone;
      engine.submit(request(*rt, free ? free_prompt : "A person as JSON:", 30, sink, free ? nullptr : person));
      engine.run_until_idle();
      *out = sink->tokens[0];
    }
  }
  // A 4 MiB pool holds 170 blocks: four sequences preempt each other, and the constrained ones keep their grammar
  // state across the recompute.
  auto rt = make_runtime_with(4);
  ServerMetrics metrics(8192, layer_metrics());
  EngineOptions options;
  options.limits.watermark = 0.0;
  Engine engine(*rt->executor, *rt->cache, *rt->tokenizer, rt->weights.config, metrics, options);
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  for (int i = 0; i < 4; ++i) {
    sinks.push_back(std::make_shared<RecordingSink>());
    const bool free = i % 2 == 0;
    engine.submit(request(*rt, free ? free_prompt : "A person as JSON:", 30, sinks.back(), free ? nullptr : person));
  }
  engine.run_until_idle();
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(sinks[size_t(i)]->finished) << sinks[size_t(i)]->error;
    EXPECT_EQ(sinks[size_t(i)]->tokens[0], i % 2 == 0 ? free_alone : constrained_alone) << "request " << i;
  }
  EXPECT_EQ(metrics.render().find("strata_preemptions_total 0"), std::string::npos) << "some sequence was preempted";
}

}  // namespace
}  // namespace strata
