#include "eval/eval_report.h"

namespace strata {

nlohmann::ordered_json settings_json(const EvalSettings& s) {
  nlohmann::ordered_json j;
  j["policies"] = s.policies;
  j["budgets"] = s.budgets;
  j["quantized_policies"] = s.quantized_policies;
  j["quantized_dtypes"] = s.quantized_dtypes;
  j["documents"] = s.documents;
  j["perplexity_prefixes"] = s.perplexity_prefixes;
  j["perplexity_tokens"] = s.perplexity_tokens;
  j["long_documents"] = s.long_documents;
  j["long_prompt"] = s.long_prompt;
  j["long_tokens"] = s.long_tokens;
  j["passkey_lengths"] = s.passkey_lengths;
  j["passkey_depths"] = s.passkey_depths;
  j["retrieval_lengths"] = s.retrieval_lengths;
  j["retrieval_depths"] = s.retrieval_depths;
  j["retrieval_trials"] = s.retrieval_trials;
  j["ruler_tasks"] = nlohmann::ordered_json::array();
  for (RulerTask t : s.ruler_tasks) j["ruler_tasks"].push_back(ruler_task_name(t));
  j["ruler_lengths"] = s.ruler_lengths;
  j["ruler_trials"] = s.ruler_trials;
  j["ruler_settings"] = nlohmann::ordered_json::array();
  for (RulerSetting x : s.ruler_settings) j["ruler_settings"].push_back(ruler_setting_name(x));
  j["agreement_context"] = s.agreement_context;
  j["agreement_prompts"] = s.agreement_prompts;
  j["agreement_tokens"] = s.agreement_tokens;
  j["seed"] = s.seed;
  j["max_batch"] = s.runner.max_batch;
  j["prefill_chunk"] = s.runner.prefill_chunk;
  j["shared_prefill"] = s.runner.share_prefill;
  return j;
}

static nlohmann::ordered_json perplexity_json(const std::vector<PerplexityScore>& scores) {
  nlohmann::ordered_json j = nlohmann::ordered_json::array();
  for (const PerplexityScore& p : scores) {
    j.push_back({{"document", p.c.document},
                 {"prefix", p.c.prefix},
                 {"tokens", p.c.tokens},
                 {"mean_nll", p.mean_nll},
                 {"perplexity", p.perplexity()},
                 {"memory_ratio", p.memory_ratio}});
  }
  return j;
}

nlohmann::ordered_json case_json(const EvalCaseResult& r) {
  nlohmann::ordered_json j;
  j["policy"] = r.c.policy;
  j["budget"] = r.c.budget;
  j["kv_dtype"] = r.c.kv_dtype;
  j["label"] = case_label(r.c);
  j["example_spec"] = case_spec(r.c, r.memory.longest_prompt);
  j["perplexity"] = perplexity_json(r.perplexity);
  j["long_generation"] = perplexity_json(r.long_generation);
  for (const PasskeyScore& p : r.passkey) {
    j["passkey"].push_back(
        {{"length", p.c.length}, {"depth", p.c.depth}, {"key", p.key}, {"answer", p.answer}, {"correct", p.correct}});
  }
  j["retrieval"] = nlohmann::ordered_json::array();
  for (const RetrievalScore& x : r.retrieval) {
    j["retrieval"].push_back({{"length", x.c.length},
                              {"depth", x.c.depth},
                              {"trial", x.c.trial},
                              {"expected", x.expected},
                              {"answer", x.answer},
                              {"correct", x.correct},
                              {"numbers_right", x.numbers_right}});
  }
  j["ruler"] = nlohmann::ordered_json::array();
  for (const RulerScore& x : r.ruler) {
    j["ruler"].push_back({{"task", ruler_task_name(x.c.task)},
                          {"length", x.c.length},
                          {"trial", x.c.trial},
                          {"setting", ruler_setting_name(x.setting)},
                          {"expected", x.expected},
                          {"answer", x.answer},
                          {"recall", x.recall}});
  }
  for (const AgreementScore& a : r.agreement) {
    j["agreement"].push_back({{"prompt", a.c.prompt},
                              {"context", a.c.context},
                              {"common_prefix", a.common_prefix},
                              {"compared", a.compared},
                              {"token_f1", a.token_f1}});
  }
  j["memory"] = {{"bytes", r.memory.bytes},
                 {"uncompressed_bytes", r.memory.uncompressed_bytes},
                 {"ratio", r.memory.ratio()},
                 {"full_precision_bytes", r.memory.full_precision_bytes},
                 {"peak_bytes", r.memory.peak_bytes},
                 {"peak_full_precision_bytes", r.memory.peak_full_precision_bytes},
                 {"peak_ratio", r.memory.peak_ratio()},
                 {"longest_prompt", r.memory.longest_prompt},
                 {"longest_entries", r.memory.longest_entries}};
  return j;
}

}  // namespace strata
