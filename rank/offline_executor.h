#pragma once
// The step executor as strata eval and strata bench drive it, in one process: plans, plus what serving never asks
// of it (keeping the logits rows on the host, sharing and forking a prompt's prefill, a prefill that starts from
// entries written without a forward pass). A door of its own, so that StepExecutor's public surface is what the
// rank uses.
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "rank/step_executor.h"

namespace strata {

class OfflineExecutor {
 public:
  explicit OfflineExecutor(StepExecutor& executor) : executor_(executor) {}

  StepResult execute(const StepPlan& plan) { return executor_.execute(plan); }

  // Tokens are sampled where the logits are (LogitsMode::sample: no vocabulary-sized row comes to the host). With
  // keep_logits(true) every sampled work item gets its logits row instead, sampled on the host, for last_logits().
  void keep_logits(bool keep) { executor_.keep_logits_ = keep; }
  // The logits of the last execute(), with keep_logits(true): one row of vocab_size floats per sampled work item,
  // in plan order (on the rank that samples). strata eval scores forced continuations with them.
  const std::vector<float>& last_logits() const { return executor_.logits_; }

  // strata bench --context: `seq` (added by an earlier plan) already holds entries written into the cache without
  // a forward pass (synthetic keys and values). Starts its prefill of prefill_len entries, those included, as a
  // first prefill chunk at position 0 would; the chunks that follow them end it and run the policies' hooks.
  void start_prefill_with_entries(SeqId seq, int prefill_len);

  // Whether a sequence under `policy` (none: the configuration's) compresses its prefill chunk by chunk
  // (kv_cache.prefill_compression chunked, or auto and its policies have the form: CompressionConfig::for_sequence).
  bool prefills_in_chunks(const std::optional<PolicySpec>& policy) const;
  // The scoring rows a chunk of a prefill of prefill_len tokens under `policy` (none: the configuration's) carries
  // where it ends at a compression point before the prefill's end (PlannedWork::n_scoring).
  ScoringRows scoring_rows(const std::optional<PolicySpec>& policy, int prefill_len) const;
  // Their tokens at the compression point `point` of `prefill` (cache/scoring_tokens.h).
  std::vector<int32_t> scoring_tokens(const ScoringRows& rows, std::span<const int32_t> prefill, int point) const;

  // strata eval's shared prefill (eval/shared_prefill.h); every sequence named was added by an earlier plan.
  // share_prefill(source), before its prefill starts: it sums every prompt row's attention in every layer and
  // keeps the sums. fork_prefix: seq starts with copies of source's first n_entries entries, and a prefill of
  // prefill_len entries continues after them (as a PrefixStart with copies does). fork_prefilled: seq starts with
  // copies of source's whole prompt and its sums, at the prompt's end: its policies' prompt-end hooks have run, and
  // its next work is its first decode step.
  void share_prefill(SeqId source);
  void fork_prefix(SeqId source, SeqId seq, int n_entries, int prefill_len);
  void fork_prefilled(SeqId source, SeqId seq);

 private:
  StepExecutor& executor_;
};

}  // namespace strata
