// strata eval on the real model: its invariants (full scores what one plain forward pass and the engine give; a
// budget at least the prompt scores what full scores; the memory it reports is what the metrics report) and its
// scoring functions on hand-computed cases.
#include <cmath>
#include <memory>
#include <regex>
#include <string>
#include <variant>
#include <vector>

#include <gtest/gtest.h>

#include "daemon/runtime.h"
#include "eval/eval_runner.h"
#include "eval/eval_suite.h"
#include "eval/eval_tasks.h"
#include "leader/engine.h"
#include "leader/metrics.h"
#include "tests/leader/recording_sink.h"
#include "tests/test_paths.h"

namespace strata {
namespace {

std::unique_ptr<RankRuntime> make_smollm2(const std::string& kv_dtype) {
  ServerConfig config = load_server_config(test::source_path("configs/smollm2-cpu.yaml"));
  config.model.path = test::smollm2_gguf_path();
  config.kv_cache.memory_mib = 256;
  // The shared prefill's invariants are end's: under chunked or auto a row that compresses in chunks prefills alone.
  config.kv_cache.prefill_compression = "end";
  apply_config_override(config, "kv_cache.dtype=" + kv_dtype);
  if (kv_dtype != "f32") apply_config_override(config, "kv_cache.block_size=32");
  return make_runtime(config);
}

RankRuntime& runtime() {
  static std::unique_ptr<RankRuntime> rt = make_smollm2("f32");
  return *rt;
}

std::string data_dir() { return test::source_path("eval/data"); }

// A 300-token prompt from a shipped text and the 24 tokens that follow it.
EvalJob scoring_job(const std::string& policy) {
  const std::vector<int32_t> doc = document_tokens(*runtime().tokenizer, data_dir(), "alice_in_wonderland");
  return perplexity_job(doc, PerplexityCase{"alice_in_wonderland", 300, 24}, policy);
}

std::vector<float> run_one(EvalJob job, EvalRunnerOptions options = {}) {
  std::vector<EvalJob> jobs{std::move(job)};
  EvalRunner(runtime(), std::move(options)).run(jobs);
  return jobs[0].forced_logprobs;
}

TEST(EvalScoring, HandComputedCases) {
  const std::vector<float> logits{0.0f, std::log(3.0f)};
  EXPECT_NEAR(token_logprob(logits, 1), std::log(0.75), 1e-6);
  EXPECT_NEAR(token_logprob(logits, 0), std::log(0.25), 1e-6);

  EvalJob ppl;
  ppl.forced_logprobs = {-1.0f, -2.0f, -3.0f};
  const PerplexityScore p = score_perplexity(PerplexityCase{"d", 10, 3}, ppl);
  EXPECT_DOUBLE_EQ(p.mean_nll, 2.0);
  EXPECT_NEAR(p.perplexity(), std::exp(2.0), 1e-9);

  EvalJob answer;
  answer.generated = {1, 2, 5, 3};
  const AgreementScore a = score_agreement(AgreementCase{0, 100}, {1, 2, 3, 4}, answer);
  EXPECT_EQ(a.common_prefix, 2);
  EXPECT_EQ(a.compared, 4);
  EXPECT_NEAR(a.token_f1, 0.75, 1e-12);  // 3 shared of 4 and 4: precision = recall = 3/4

  EXPECT_EQ(case_spec({"full", "", "f32"}, 1000), "full");
  EXPECT_EQ(case_spec({"snapkv", "64", "f32"}, 1000), "snapkv:budget=64");
  EXPECT_EQ(case_spec({"pyramidkv", "20%", "f32"}, 1000), "pyramidkv:budget=20%");
  EXPECT_EQ(case_spec({"simlayerkv", "20%", "f32"}, 1000), "simlayerkv:window=196");  // 200 minus 4 initial
  EXPECT_EQ(case_spec({"d2o", "20%", "f32"}, 1000), "d2o:hh_ratio=0.100000,recent_ratio=0.100000");
  EXPECT_EQ(case_spec({"d2o", "128", "f32"}, 1000), "d2o:hh_ratio=0.064000,recent_ratio=0.064000");
  EXPECT_EQ(case_spec({"spindlekv", "20%", "f32"}, 1000), "spindlekv:ratio=0.200000");
  EXPECT_EQ(case_spec({"pod", "64", "f32"}, 1000), "pod:recent=48");
  // A long generation's percent budget: a share of its final length, as a token count.
  EXPECT_EQ(with_budget_of({"streaming", "10%", "f32"}, 1152).budget, "116");
  EXPECT_EQ(with_budget_of({"h2o", "128", "int4"}, 1152).budget, "128");
  EXPECT_EQ(case_spec(with_budget_of({"h2o", "10%", "f32"}, 1152), 128), "h2o:budget=116");
  EXPECT_EQ(case_spec({"simlayerkv+snapkv", "10%", "f32"}, 1000),
            "simlayerkv:strategy=prefill,window=96,kept=snapkv,kept_budget=10%");
  // A policy's own parameters come first; the budget's follow, in the policy's own form.
  EXPECT_EQ(case_spec({"h2o:mode=per_step", "50%", "f32"}, 1000), "h2o:mode=per_step,budget=50%");
  EXPECT_EQ(case_spec(with_budget_of({"streaming:mode=rolling", "10%", "f32"}, 1152), 128),
            "streaming:mode=rolling,budget=116");
  EXPECT_EQ(case_spec({"d2o:merge=false", "20%", "int4"}, 1000),
            "d2o:merge=false,hh_ratio=0.100000,recent_ratio=0.100000");
  EXPECT_EQ(case_label({"h2o:mode=per_step", "50%", "int4"}), "h2o:mode=per_step@50%+int4");
  EXPECT_EQ(join_policy_parameters({"h2o:mode=per_step", "window=16", "snapkv", "streaming:mode=rolling"}),
            (std::vector<std::string>{"h2o:mode=per_step,window=16", "snapkv", "streaming:mode=rolling"}));
}

TEST(EvalPasskey, KeySitsAtTheAskedDepth) {
  const Tokenizer& tok = *runtime().tokenizer;
  for (double depth : {0.0, 0.5, 1.0}) {
    std::string key;
    const EvalJob job = passkey_job(tok, *runtime().chat_template, PasskeyCase{1000, depth}, 42, "", &key);
    ASSERT_EQ(key.size(), 5u);
    EXPECT_NEAR(double(job.prompt.size()), 1000.0, 60.0);
    const std::string text = tok.decode(job.prompt, false);
    const double begin = double(text.find("There is an important"));
    const double end = double(text.find("\nWhat is the pass key?"));
    const double at = (double(text.find("The pass key is " + key)) - begin) / (end - begin);
    EXPECT_NEAR(at, depth, 0.08) << "depth " << depth;
    EXPECT_EQ(text.substr(text.size() - 15), "The pass key is") << "the answer is primed";
  }
  std::string k1, k2;
  passkey_job(tok, *runtime().chat_template, PasskeyCase{1000, 0.5}, 1, "", &k1);
  passkey_job(tok, *runtime().chat_template, PasskeyCase{1000, 0.5}, 1, "", &k2);
  EXPECT_EQ(k1, k2) << "the same seed gives every policy the same key";
}

// The runner decodes the continuation one token at a time through the cache; one prefill over the whole text
// with logits at every position is an independent path to the same numbers.
TEST(EvalInvariants, FullScoresWhatOnePlainForwardGives) {
  EvalJob job = scoring_job("full");
  const std::vector<float> scored = run_one(job);
  ASSERT_EQ(scored.size(), job.forced.size());

  RankRuntime& rt = runtime();
  std::vector<int32_t> text = job.prompt;
  text.insert(text.end(), job.forced.begin(), job.forced.end() - 1);
  const SeqId seq = 1'000'000;
  std::vector<float> logits;
  const BatchSequence b{seq, text, 0, LogitsMode::all, nullptr};
  rt.model->forward({&b, 1}, *rt.cache, logits);
  rt.cache->release(seq);
  const size_t vocab = size_t(rt.weights.config.vocab_size);
  for (size_t i = 0; i < job.forced.size(); ++i) {
    const size_t row = job.prompt.size() - 1 + i;
    const float expected =
        token_logprob(std::span<const float>(logits.data() + row * vocab, vocab), job.forced[i]);
    EXPECT_NEAR(scored[i], expected, 2e-3) << "token " << i;
  }
}

TEST(EvalInvariants, FullGeneratesWhatTheEngineGenerates) {
  RankRuntime& rt = runtime();
  const std::vector<int32_t> doc = document_tokens(*rt.tokenizer, data_dir(), "around_the_world_in_80_days");
  const std::vector<int32_t> passage(doc.begin(), doc.begin() + 200);
  std::vector<EvalJob> jobs{agreement_job(*rt.tokenizer, *rt.chat_template, passage,
                                          "Summarize the passage above in three sentences.", 24, "full")};
  EvalRunner(rt, {}).run(jobs);

  ServerMetrics metrics(8192, layer_metrics());
  Engine engine(*rt.executor, *rt.cache, *rt.tokenizer, rt.weights.config, metrics, EngineOptions{});
  auto sink = std::make_shared<test::RecordingSink>();
  GenerationRequest r;
  r.id = "eval-test";
  r.prompt_ids = jobs[0].prompt;
  r.sampling.temperature = 0.0f;
  r.sampling.max_tokens = 24;
  r.sink = sink;
  engine.submit(std::move(r));
  engine.run_until_idle();
  ASSERT_FALSE(jobs[0].generated.empty());
  EXPECT_EQ(jobs[0].generated, sink->tokens[0]);
}

TEST(EvalInvariants, BudgetAtLeastThePromptScoresLikeFull) {
  const std::vector<float> full = run_one(scoring_job("full"));
  for (const char* spec : {"snapkv:budget=400", "pyramidkv:budget=400", "h2o:budget=400", "streaming:budget=400",
                           "snapkv:budget=100%", "simlayerkv:window=400"}) {
    const std::vector<float> scored = run_one(scoring_job(spec));
    ASSERT_EQ(scored.size(), full.size());
    for (size_t i = 0; i < full.size(); ++i) EXPECT_NEAR(scored[i], full[i], 1e-5) << spec << " token " << i;
  }
  // And a budget below the prompt does change the scores: the comparison above can fail.
  const std::vector<float> compressed = run_one(scoring_job("pyramidkv:budget=32"));
  double diff = 0.0;
  for (size_t i = 0; i < full.size(); ++i) diff += std::abs(compressed[i] - full[i]);
  EXPECT_GT(diff, 1e-3);
}

// Every policy's row on one prompt, started from its shared prefill (forked at the prompt's end with its sums, or
// before its observation window), scores and generates bit for bit what it does prefilling alone.
void expect_shared_prefill_is_exact(RankRuntime& rt, const std::vector<std::string>& policies) {
  const std::vector<int32_t> doc = document_tokens(*rt.tokenizer, data_dir(), "alice_in_wonderland");
  std::vector<EvalJob> jobs;
  for (const std::string& policy : policies) {
    jobs.push_back(perplexity_job(doc, PerplexityCase{"alice_in_wonderland", 300, 20}, policy));
    EvalJob answer;
    answer.prompt.assign(doc.begin() + 1000, doc.begin() + 1300);
    answer.generate = 12;
    answer.policy = policy;
    jobs.push_back(std::move(answer));
  }
  EvalRunnerOptions options;
  options.prefill_chunk = 128;  // several chunks, so that the window policies fork at 256
  options.max_batch = 1;  // batched rows round differently (a batch's matmuls), shared or not
  options.share_prefill = false;
  std::vector<EvalJob> alone = jobs;
  EvalRunner solo(rt, options);
  solo.run(alone);
  options.share_prefill = true;
  EvalRunner shared(rt, options);
  shared.run(jobs);
  EXPECT_EQ(solo.prefills(), int64_t(jobs.size()));
  EXPECT_LT(shared.prefills(), solo.prefills() / 2);
  for (size_t i = 0; i < jobs.size(); ++i) {
    EXPECT_EQ(jobs[i].forced_logprobs, alone[i].forced_logprobs) << jobs[i].policy;
    EXPECT_EQ(jobs[i].generated, alone[i].generated) << jobs[i].policy;
    ASSERT_EQ(jobs[i].layers.size(), alone[i].layers.size());
    for (size_t l = 0; l < jobs[i].layers.size(); ++l) {
      EXPECT_EQ(jobs[i].layers[l].entries, alone[i].layers[l].entries) << jobs[i].policy << " layer " << l;
      EXPECT_EQ(jobs[i].layers[l].bytes, alone[i].layers[l].bytes) << jobs[i].policy << " layer " << l;
    }
  }
  EXPECT_EQ(rt.cache->pool().n_free(), rt.cache->pool().n_total()) << "every block is back, the shared ones too";
}

TEST(EvalInvariants, SharedPrefillScoresExactlyWhatEachRowScoresAlone) {
  expect_shared_prefill_is_exact(runtime(), {"full", "streaming:budget=64", "h2o:budget=64", "h2o:budget=64,mode=per_step",
                                             "snapkv:budget=64", "pyramidkv:budget=64", "simlayerkv:window=60",
                                             "d2o:hh_ratio=0.1,recent_ratio=0.1", "spindlekv:ratio=0.2",
                                             "simlayerkv:strategy=prefill,window=60,kept=pyramidkv,kept_budget=64"});
}

TEST(EvalInvariants, SharedPrefillIsExactOnAQuantizedCache) {
  std::unique_ptr<RankRuntime> int4 = make_smollm2("int4");
  expect_shared_prefill_is_exact(*int4, {"full", "simlayerkv:window=60", "snapkv:budget=64", "h2o:budget=64"});
}

// The value of one per-layer series in the Prometheus text.
double metric_value(const std::string& text, const std::string& name, int layer) {
  const std::regex line(name + "\\{[^}]*layer=\"" + std::to_string(layer) + "\"[^}]*\\} ([0-9.e+]+)");
  std::smatch m;
  if (!std::regex_search(text, m, line)) throw std::runtime_error(name + " for layer " + std::to_string(layer));
  return std::stod(m[1]);
}

// The memory eval reports for a job equals what /metrics would show with that job alone in the cache, at f32
// and with int4 blocks (whose bytes are their own, smaller size).
void expect_memory_matches_metrics(RankRuntime& rt, const std::string& policy, double min_ratio) {
  std::string rendered;
  EvalRunnerOptions options;
  options.before_release = [&](const EvalJob&, const KvCache& cache) {
    ServerMetrics metrics(8192, layer_metrics());
    for (int l = cache.layer_begin(); l < cache.layer_end(); ++l) {
      const LayerUsage u = cache.layer_usage(l);
      metrics.set_layer_kv(l, 0, 0, u.entries, u.bytes, u.uncompressed_bytes);
    }
    rendered = metrics.render();
  };
  std::vector<EvalJob> jobs{scoring_job(policy)};
  EvalRunner(rt, options).run(jobs);
  ASSERT_FALSE(rendered.empty());
  ASSERT_EQ(int(jobs[0].layers.size()), rt.weights.config.n_layers);
  EvalMemory memory;
  for (size_t l = 0; l < jobs[0].layers.size(); ++l) {
    const LayerHeld& h = jobs[0].layers[l];
    EXPECT_EQ(double(h.entries), metric_value(rendered, "strata_kv_layer_tokens", int(l)));
    EXPECT_EQ(double(h.bytes), metric_value(rendered, "strata_kv_layer_bytes", int(l)));
    EXPECT_EQ(double(h.uncompressed_bytes), metric_value(rendered, "strata_kv_layer_uncompressed_bytes", int(l)));
    memory.bytes.push_back(h.bytes);
    memory.uncompressed_bytes.push_back(h.uncompressed_bytes);
  }
  EXPECT_GT(memory.ratio(), min_ratio) << policy;
  EXPECT_EQ(rt.cache->pool().n_free(), rt.cache->pool().n_total()) << "every block is back after the run";
}

TEST(EvalInvariants, MemoryIsWhatTheMetricsReport) {
  expect_memory_matches_metrics(runtime(), "pyramidkv:budget=64", 2.0);  // 324 tokens, about 64 per layer
}

TEST(EvalInvariants, QuantizedMemoryIsWhatTheMetricsReport) {
  std::unique_ptr<RankRuntime> int4 = make_smollm2("int4");
  expect_memory_matches_metrics(*int4, "full", 2.0);  // int4 codes with per-group scales, a partial group in f32
  // And int4 costs little in what the model predicts on this text.
  const std::vector<float> f32 = run_one(scoring_job("full"));
  std::vector<EvalJob> jobs{scoring_job("full")};
  EvalRunner(*int4, {}).run(jobs);
  double nll_f32 = 0.0, nll_int4 = 0.0;
  for (size_t i = 0; i < f32.size(); ++i) {
    nll_f32 -= f32[i];
    nll_int4 -= jobs[0].forced_logprobs[i];
  }
  EXPECT_NEAR(nll_int4 / double(f32.size()), nll_f32 / double(f32.size()), 0.25);
}

TEST(EvalSuiteSmall, RunsEveryTaskAndFullIsItsOwnReference) {
  RankRuntime& rt = runtime();
  EvalSettings s;
  s.data_dir = data_dir();
  s.policies = {"snapkv"};
  s.budgets = {"40", "100%"};  // snapkv keeps its window of 32 on top
  s.quantized_policies = {};
  s.documents = {"alice_in_wonderland"};
  s.perplexity_prefixes = {200};
  s.perplexity_tokens = 12;
  s.long_documents = 1;
  s.long_prompt = 24;
  s.long_tokens = 40;
  s.retrieval_lengths = {300};
  s.retrieval_depths = {0.5};
  s.retrieval_trials = 1;
  s.ruler_tasks = {RulerTask::niah_single};
  s.ruler_lengths = {300};
  s.ruler_trials = 1;
  s.passkey_lengths = {200};
  s.passkey_depths = {0.5};
  s.agreement_context = 150;
  s.agreement_prompts = 2;
  s.agreement_tokens = 12;
  EvalSuite suite(s, *rt.tokenizer, *rt.chat_template);
  const std::vector<EvalCase> cases = suite.cases();
  ASSERT_EQ(cases.size(), 3u);
  const std::vector<EvalCaseResult> results = suite.run(cases, rt);
  ASSERT_EQ(results.size(), 3u);
  const EvalCaseResult& full = results[0];
  const EvalCaseResult& small = results[1];
  const EvalCaseResult& whole = results[2];
  // 8 prompts (perplexity, long generation, retrieval, RULER's in both settings, passkey, 2 agreement), each
  // prefilled once; snapkv@40's window starts inside the first 512-token chunk of the 7 prompts longer than 40
  // tokens, so it prefills those alone; full and snapkv@100% fork. Alone, the 24 jobs would prefill 24 times.
  EXPECT_EQ(suite.prefills(), 8 + 7);

  ASSERT_EQ(full.perplexity.size(), 1u);
  EXPECT_TRUE(std::isfinite(full.perplexity[0].perplexity()));
  EXPECT_GT(full.perplexity[0].perplexity(), 1.0);
  EXPECT_NEAR(whole.perplexity[0].mean_nll, full.perplexity[0].mean_nll, 1e-6);
  ASSERT_EQ(full.long_generation.size(), 1u);
  EXPECT_EQ(full.long_generation[0].c.tokens, 40);
  EXPECT_NEAR(small.long_generation[0].mean_nll, full.long_generation[0].mean_nll, 1e-6)
      << "SnapKV compresses the prompt only, and 24 tokens fit in 40";
  EXPECT_DOUBLE_EQ(small.long_generation[0].memory_ratio, 1.0) << "so it held everything: the row measures nothing";
  EXPECT_GT(small.perplexity[0].memory_ratio, 2.0);
  EXPECT_NE(small.long_generation[0].mean_nll, small.perplexity[0].mean_nll);
  ASSERT_EQ(full.agreement.size(), 2u);
  for (const AgreementScore& a : full.agreement) {
    EXPECT_EQ(a.common_prefix, a.compared);
    EXPECT_DOUBLE_EQ(a.token_f1, 1.0);
  }
  for (const AgreementScore& a : whole.agreement) EXPECT_EQ(a.common_prefix, a.compared);
  EXPECT_DOUBLE_EQ(full.memory.ratio(), 1.0);
  EXPECT_DOUBLE_EQ(whole.memory.ratio(), 1.0);
  EXPECT_GT(small.memory.ratio(), 2.0);
  // At its peak a sequence compressed at its prompt's end held the whole prompt: the saving is the end's only.
  EXPECT_DOUBLE_EQ(full.memory.peak_ratio(), 1.0);
  EXPECT_LT(small.memory.peak_ratio(), 1.3);
  EXPECT_GE(small.memory.peak_ratio(), 1.0);
  ASSERT_EQ(full.retrieval.size(), 1u);
  EXPECT_EQ(full.retrieval[0].c.length, 300);
  EXPECT_FALSE(full.retrieval[0].expected.empty());
  // RULER: one prompt in both settings. With every entry kept, feeding the question after the prompt's end is
  // the same computation as prefilling it, so `full` answers alike in both.
  ASSERT_EQ(full.ruler.size(), 2u);
  EXPECT_EQ(full.ruler[0].setting, RulerSetting::in_prompt);
  EXPECT_EQ(full.ruler[1].setting, RulerSetting::after_compression);
  EXPECT_EQ(full.ruler[0].expected, full.ruler[1].expected);
  ASSERT_EQ(full.ruler[0].expected.size(), 1u);
  EXPECT_FALSE(full.ruler[0].answer.empty());
  EXPECT_EQ(full.ruler[0].answer, full.ruler[1].answer);
  EXPECT_EQ(whole.ruler[1].answer, full.ruler[1].answer);
  ASSERT_EQ(full.passkey.size(), 1u);
  EXPECT_EQ(full.passkey[0].key.size(), 5u);
  EXPECT_EQ(full.memory.longest_entries.size(), size_t(rt.weights.config.n_layers));
}

}  // namespace
}  // namespace strata
