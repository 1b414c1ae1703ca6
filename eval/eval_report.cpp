#include "eval/eval_report.h"

namespace strata {

nlohmann::ordered_json settings_json(const EvalSettings& s) {
  nlohmann::ordered_json j;
  j["policies"] = s.policies;
  j["budgets"] = s.budgets;
  j["quantized_policies"] = s.quantized_policies;
  j["quantized_dtype"] = s.quantized_dtype;
  j["documents"] = s.documents;
  j["perplexity_prefixes"] = s.perplexity_prefixes;
  j["perplexity_tokens"] = s.perplexity_tokens;
  j["passkey_lengths"] = s.passkey_lengths;
  j["passkey_depths"] = s.passkey_depths;
  j["agreement_context"] = s.agreement_context;
  j["agreement_prompts"] = s.agreement_prompts;
  j["agreement_tokens"] = s.agreement_tokens;
  j["seed"] = s.seed;
  j["max_batch"] = s.runner.max_batch;
  j["prefill_chunk"] = s.runner.prefill_chunk;
  return j;
}

nlohmann::ordered_json case_json(const EvalCaseResult& r) {
  nlohmann::ordered_json j;
  j["policy"] = r.c.policy;
  j["budget"] = r.c.budget;
  j["kv_dtype"] = r.c.kv_dtype;
  j["example_spec"] = case_spec(r.c, r.memory.longest_prompt);
  j["seconds"] = r.seconds;
  for (const PerplexityScore& p : r.perplexity) {
    j["perplexity"].push_back({{"document", p.c.document},
                               {"prefix", p.c.prefix},
                               {"tokens", p.c.tokens},
                               {"mean_nll", p.mean_nll},
                               {"perplexity", p.perplexity()}});
  }
  for (const PasskeyScore& p : r.passkey) {
    j["passkey"].push_back(
        {{"length", p.c.length}, {"depth", p.c.depth}, {"key", p.key}, {"answer", p.answer}, {"correct", p.correct}});
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
                 {"longest_prompt", r.memory.longest_prompt},
                 {"longest_entries", r.memory.longest_entries}};
  return j;
}

}  // namespace strata
