#pragma once
// The grid of `strata eval`: every policy at every budget (token counts and fractions of the prompt) over the
// perplexity, passkey, retrieval, RULER and agreement tasks, plus the memory each layer held. `full` runs first: it is the reference
// the others are compared with. Results are plain structs, written as JSON by eval_report.h.
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "eval/eval_tasks.h"
#include "eval/retrieval_task.h"
#include "eval/ruler_tasks.h"

namespace strata {

struct EvalSettings {
  std::string data_dir = "eval/data";
  // The rows at full precision besides `full` (empty: none, only quantized_policies'): any policy make_policy
  // knows; also the compositions simlayerkv+snapkv and simlayerkv+pyramidkv (SimLayerKV whose layers found not
  // lazy run the other policy; case_spec), and a policy with parameters of its own besides the budget
  // ("h2o:mode=per_step", "streaming:mode=rolling": the modes that evict while decoding).
  std::vector<std::string> policies;
  std::vector<std::string> budgets = {"64", "128", "256", "512", "1024", "10%", "20%", "50%"};
  // Run again over a quantized cache, at the same budgets, for every format of quantized_dtypes ("full" among them:
  // one row per format).
  std::vector<std::string> quantized_policies = {"simlayerkv"};
  std::vector<std::string> quantized_dtypes = {"int4"};
  // The cache format of the other rows: the configuration's kv_cache.dtype (f32, or f16 | bf16 at half its memory).
  std::string base_dtype = "f32";
  std::vector<std::string> documents;           // empty: every document of <data_dir>/documents.txt
  std::vector<int> perplexity_prefixes = {2048, 4096, 7936};  // 7,936 + 256 scored tokens: the 8,192 of SmolLM2
  int perplexity_tokens = 256;
  // Long generation: a short prompt of each of the first long_documents documents, then long_tokens scored one by
  // one, so that the policies that evict while decoding (rolling StreamingLLM, per-step H2O, D2O) are measured
  // while they do.
  int long_documents = 4;
  int long_prompt = 128;
  int long_tokens = 1024;
  // Retrieval (eval/retrieval_task.h): `full` solves it, so that what a policy loses shows. Not at 8,000 tokens:
  // SmolLM2-135M cannot copy from 7,750 tokens back or more (docs/eval/retrieval-design.md).
  std::vector<int> retrieval_lengths = {2048, 4096, 7000};
  std::vector<double> retrieval_depths = {0.0, 0.1, 0.25, 0.5, 0.75, 1.0};
  int retrieval_trials = 3;
  // RULER's task families (eval/ruler_tasks.h), each at each length, `ruler_trials` prompts, in each setting.
  std::vector<RulerTask> ruler_tasks = strata::ruler_tasks();
  std::vector<int> ruler_lengths = {2048, 4096};
  int ruler_trials = 2;
  std::vector<RulerSetting> ruler_settings = {RulerSetting::in_prompt, RulerSetting::after_compression};
  std::vector<int> passkey_lengths = {1024, 2048, 4096, 8000};
  std::vector<double> passkey_depths = {0.0, 0.25, 0.5, 0.75, 1.0};
  int agreement_context = 1024;                 // passage tokens
  int agreement_prompts = 8;                    // instructions used (each over one passage per document)
  int agreement_tokens = 48;                    // answer tokens compared
  uint64_t seed = 1;
  EvalRunnerOptions runner;
};

// One policy at one budget (or `full`).
struct EvalCase {
  std::string policy;     // a name, or a name with its own parameters: "h2o:mode=per_step"
  std::string budget;     // "" for full
  std::string kv_dtype;   // the cache format: "f32", "int4", ...
};

// The policy spec a case uses for a prompt of prompt_len tokens (budgets become each policy's parameters, after
// the policy's own).
std::string case_spec(const EvalCase& c, int prompt_len);
// A --policies list split at its commas, with the commas inside one policy's parameters put back: an item with
// "=" and no ":" continues the policy before it ("h2o:mode=per_step,window=16" is one policy; no name has "=").
std::vector<std::string> join_policy_parameters(const std::vector<std::string>& items);
// The case with a percent budget made a token count of `length` tokens (unchanged otherwise). A long-generation
// job's budget is a share of its final length, prompt and scored tokens: a share of its short prompt would leave
// the policies that evict while decoding a few tokens for a thousand steps.
EvalCase with_budget_of(const EvalCase& c, int length);

// What every layer held, summed over the jobs of a case, and per layer for its longest prompt.
struct EvalMemory {
  std::vector<int64_t> bytes, uncompressed_bytes;  // per layer, summed over the case's jobs
  std::vector<int64_t> longest_entries;            // per layer, the job with the longest prompt
  int longest_prompt = 0;
  int64_t peak_bytes = 0;                          // the jobs' peaks (EvalJob::peak), summed
  int64_t peak_full_precision_bytes = 0;           // of which full precision (LayerUsage::full_precision_bytes)
  int64_t full_precision_bytes = 0;                // the same at the jobs' ends, over all layers
  double ratio() const;                            // uncompressed / held, over all layers, at the jobs' ends
  double peak_ratio() const;                       // uncompressed at the end / held at the peak
};

// The row's name in reports: "snapkv@128", "simlayerkv@20%+int4", "full".
std::string case_label(const EvalCase& c);

struct EvalCaseResult {
  EvalCase c;
  std::vector<PerplexityScore> perplexity;
  std::vector<PerplexityScore> long_generation;
  std::vector<PasskeyScore> passkey;
  std::vector<RetrievalScore> retrieval;
  std::vector<RulerScore> ruler;
  std::vector<AgreementScore> agreement;
  EvalMemory memory;
};

class EvalSuite {
 public:
  EvalSuite(EvalSettings settings, const Tokenizer& tokenizer, const ChatTemplate& chat);

  // The cases in order: full first, then budget by budget every policy, then the quantized runs.
  std::vector<EvalCase> cases() const;
  // Runs cases on `runtime` (whose cache format must be every case's kv_dtype) in one go, so that the jobs of
  // every case on the same prompt share its prefill (eval/shared_prefill.h). `full`'s agreement answers are the
  // reference of the later cases, so the first call must include full.
  std::vector<EvalCaseResult> run(std::span<const EvalCase> cases, RankRuntime& runtime,
                                  const std::function<void(size_t, size_t)>& progress = {});
  // Prefills run so far over every call of run().
  int64_t prefills() const { return prefills_; }

  const EvalSettings& settings() const { return settings_; }

 private:
  struct CaseJobs;
  // The jobs of one case: one per perplexity, passkey and agreement case of the settings.
  CaseJobs jobs_for(const EvalCase& c) const;
  bool runs_ruler() const;
  void make_ruler_prompts();
  // Scores the jobs run for c and sums the memory they held.
  EvalCaseResult score(const EvalCase& c, const CaseJobs& jobs);

  EvalSettings settings_;
  const Tokenizer& tokenizer_;
  const ChatTemplate& chat_;
  std::vector<std::vector<int32_t>> documents_;
  std::vector<std::string> instructions_;
  std::vector<std::string> retrieval_texts_;
  std::vector<std::pair<RulerCase, RulerPrompt>> ruler_prompts_;  // every case's prompt, in the order of the jobs
  std::vector<std::vector<int32_t>> reference_answers_;  // full's agreement answers
  int64_t prefills_ = 0;
};

}  // namespace strata
