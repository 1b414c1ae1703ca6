#pragma once
// What every rank does with a StepPlan: create and forget per-sequence state, free the blocks of preempted and
// finished sequences, run its shard of the forward pass (with the attention statistics its layers' compression
// policies ask for), sample (on the last stage), and hand each sequence's work to its compression
// (rank/sequence_compression.h). With one rank the leader calls it directly.
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "cache/compression_config.h"
#include "cache/kv_cache.h"
#include "cache/pod_blocks.h"
#include "cache/policy_collectives.h"
#include "model/llama_model.h"
#include "parallel/rank_report.h"
#include "parallel/step_plan.h"
#include "rank/sequence_compression.h"
#include "rank/sequence_sampler.h"

namespace strata {

class StepExecutor {
 public:
  // collectives: what the policies need from the other ranks of the world (cache/policy_collectives.h); null
  // for a world of one.
  StepExecutor(LlamaModel& model, KvCache& cache, CompressionConfig compression, std::string model_name,
               PolicyCollectives* collectives = nullptr);

  StepResult execute(const StepPlan& plan);

  // What the policies did per local layer since the last call, then reset.
  std::vector<LayerCompressionCounts> take_counts();
  // Tokens are sampled where the logits are (LogitsMode::sample: no vocabulary-sized row comes to the host). With
  // keep_logits(true) every sampled work item gets its logits row instead, sampled on the host, for last_logits().
  void keep_logits(bool keep) { keep_logits_ = keep; }
  // The logits of the last execute(), with keep_logits(true): one row of vocab_size floats per sampled work item,
  // in plan order (on the rank that samples). strata eval scores forced continuations with them.
  const std::vector<float>& last_logits() const { return logits_; }
  // What the policies of a sequence's local layers report (empty when unknown or before its prefill).
  std::vector<SequenceLayerDetail> policy_detail(SeqId seq) const;
  // PoD's layer blocks (kv_cache.pod_blocks, checked against the model and the stages), for the sequences whose
  // policies share keys.
  void set_pod_blocks(PodBlocks blocks) { shard_.pod_blocks = std::move(blocks); }
  // Whether a request's policy (for every layer) can run on this shard's cache: throws std::invalid_argument,
  // as a sequence with it would, before the request is queued (routing/ answers 400).
  void check_request_policy(const PolicySpec& spec) const { shard_.check_request_policy(spec); }
  // strata bench --context: `seq` (added by an earlier plan) already holds entries written into the cache without
  // a forward pass (synthetic keys and values). Starts its prefill of prefill_len entries, those included, as a
  // first prefill chunk at position 0 would; the chunks that follow them end it and run the policies' hooks.
  void start_prefill_with_entries(SeqId seq, int prefill_len);

  // strata eval's shared prefill (eval/shared_prefill.h), in one process; every sequence named was added by an
  // earlier plan. share_prefill(source), before its prefill starts: it sums every prompt row's attention in every
  // layer and keeps the sums. fork_prefix: seq starts with copies of source's first n_entries entries, and a prefill
  // of prefill_len entries continues after them (as a PrefixStart with copies does). fork_prefilled: seq starts
  // with copies of source's whole prompt and its sums, at the prompt's end: its policies' prompt-end hooks have run,
  // and its next work is its first decode step.
  void share_prefill(SeqId source) { state_of(source).compression.sum_every_prompt_row(); }
  void fork_prefix(SeqId source, SeqId seq, int n_entries, int prefill_len);
  void fork_prefilled(SeqId source, SeqId seq);

 private:
  struct SequenceState {
    SequenceSampler sampler;
    SequenceCompression compression;
  };

  void update_sequences(const StepPlan& plan);
  std::vector<BatchSequence> batch_of(const StepPlan& plan);
  StepResult collect_tokens(const StepPlan& plan, const std::vector<BatchSequence>& batch);
  SequenceState& state_of(SeqId seq);

  LlamaModel& model_;
  KvCache& cache_;
  ShardCompression shard_;
  std::unordered_map<SeqId, SequenceState> seqs_;
  std::vector<float> logits_;
  std::vector<RowSampling> sampling_;  // per work item of the step being executed (LogitsMode::sample)
  std::vector<RowSample> samples_;     // the tokens of the LogitsMode::sample items of the last execute()
  bool keep_logits_ = false;
};

}  // namespace strata
