#pragma once
// What every rank does with a StepPlan: create and forget per-sequence state, free the blocks of preempted and
// finished sequences, run its shard of the forward pass (with the attention statistics its layers' compression
// policies ask for), sample (on the last stage), and run the policies' hooks on its own layers. With one rank the
// leader calls it directly.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "cache/compression_config.h"
#include "cache/compression_policy.h"
#include "cache/kv_cache.h"
#include "cache/pod_blocks.h"
#include "cache/policy_collectives.h"
#include "model/llama_model.h"
#include "parallel/step_plan.h"
#include "rank/sequence_sampler.h"

namespace strata {

// What the policies of one layer did since the last report (for the metrics).
struct LayerCompressionCounters {
  int64_t evicted_tokens = 0;
  int64_t lazy_decisions = 0;      // SimLayerKV: layers found lazy
  int64_t not_lazy_decisions = 0;  // and found not lazy
  int64_t merged_tokens = 0;       // D2O: evicted entries merged into kept ones (per KV head, like evicted_tokens)
  int64_t key_free_blocks = 0;     // PoD: blocks freed by dropping a follower's distant keys
};

// One layer of one sequence, for the JSON view.
struct LayerPolicyState {
  std::string policy;        // the spec in effect
  std::optional<bool> lazy;  // SimLayerKV's verdict, once taken
  std::optional<int> capacity;  // the most entries the policy holds the layer to, once fixed (D2O's budget)
  int64_t merged_tokens = 0;    // evicted entries merged into kept ones so far (D2O)
  int64_t codebook_keys = 0;    // SpindleKV: codebook entries over the layer's KV heads, keys and values
  int64_t codebook_values = 0;
};

class StepExecutor {
 public:
  // collectives: what the policies need from the other ranks of the world (cache/policy_collectives.h); null
  // for a world of one.
  StepExecutor(LlamaModel& model, KvCache& cache, CompressionConfig compression, std::string model_name,
               PolicyCollectives* collectives = nullptr);

  StepResult execute(const StepPlan& plan);

  size_t n_sequences() const { return seqs_.size(); }
  // Counters per local layer since the last call, then reset.
  std::vector<LayerCompressionCounters> take_counters();
  // Tokens are sampled where the logits are (LogitsMode::sample: no vocabulary-sized row comes to the host). With
  // keep_logits(true) every sampled work item gets its logits row instead, sampled on the host, for last_logits().
  void keep_logits(bool keep) { keep_logits_ = keep; }
  // The logits of the last execute(), with keep_logits(true): one row of vocab_size floats per sampled work item,
  // in plan order (on the rank that samples). strata eval scores forced continuations with them.
  const std::vector<float>& last_logits() const { return logits_; }
  // The policies of a sequence's local layers (empty when unknown or not built yet).
  std::vector<LayerPolicyState> layer_policies(int64_t seq) const;
  // PoD's layer blocks (kv_cache.pod_blocks, checked against the model and the stages). Sequences whose policy is
  // `pod` need them.
  void set_pod_blocks(PodBlocks blocks) { pod_blocks_ = std::move(blocks); }
  // strata bench --context: `seq` (added by an earlier plan) already holds entries written into the cache without
  // a forward pass (synthetic keys and values). Starts its prefill of prefill_len entries, those included, as a
  // first prefill chunk at position 0 would; the chunks that follow them end it and run the policies' hooks.
  void start_prefill_with_entries(int64_t seq, int prefill_len);

 private:
  struct SequenceState {
    explicit SequenceState(SequenceSampler s) : sampler(std::move(s)) {}

    SequenceSampler sampler;
    std::optional<PolicySpec> request_policy;  // replaces the server's configuration when set
    int prefill_len = 0;                       // of the current prefill (the prompt, or a recompute)
    std::vector<std::unique_ptr<CompressionPolicy>> policies;  // per local layer, built when a prefill starts
    std::unique_ptr<AttentionStats> prefill_stats;
    bool cross_layer = false;            // a layer of the model, on any stage, takes part in the cross-layer step
    std::vector<int64_t> merged_tokens;  // per local layer, since the prefill started
    std::unique_ptr<PodSequence> pod;    // PoD: the window and the leaders of the local layers
  };

  void start_prefill(SequenceState& state, int prefill_len);
  const PolicySpec& spec_for(const SequenceState& state, int global_layer) const;
  PolicyContext policy_context(int global_layer) const;
  void cross_layer_step(int64_t seq, SequenceState& state);
  std::unique_ptr<AttentionStats> decode_stats(const PlannedWork& work, SequenceState& state);
  void run_hooks(const PlannedWork& work, SequenceState& state, const AttentionStats* decode);
  void seal_groups(const PlannedWork& work, const SequenceState& state);
  std::unique_ptr<PodSequence> pod_sequence(const SequenceState& state) const;
  void free_distant_keys(const PlannedWork& work, const SequenceState& state);
  void apply(int64_t seq, SequenceState& state, int global_layer, int n_entries, const std::optional<Selection>& keep);
  LayerState layer_state(const SequenceState& state, int64_t seq, int global_layer, const AttentionStats* stats,
                         int n_generated) const;

  LlamaModel& model_;
  KvCache& cache_;
  CompressionConfig compression_;
  std::string model_name_;
  PolicyCollectives& collectives_;
  std::unordered_map<int64_t, SequenceState> seqs_;
  std::vector<LayerCompressionCounters> counters_;  // per local layer
  std::vector<float> logits_;
  std::vector<RowSampling> sampling_;  // per work item of the step being executed (LogitsMode::sample)
  std::vector<RowSample> samples_;     // the tokens of the LogitsMode::sample items of the last execute()
  bool keep_logits_ = false;
  std::optional<PodBlocks> pod_blocks_;
};

}  // namespace strata
