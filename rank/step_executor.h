#pragma once
// What every rank does with a StepPlan: create and forget per-sequence state, free the blocks of preempted and
// finished sequences, run its shard of the forward pass (with the attention statistics its layers' compression
// policies ask for), sample (on the last stage), and hand each sequence's work to its compression
// (rank/sequence_compression.h). With one rank the leader calls it directly. strata eval and strata bench drive it
// through rank/offline_executor.h.
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
  // What the policies of a sequence's local layers report (empty when unknown or before its prefill).
  std::vector<SequenceLayerDetail> policy_detail(SeqId seq) const;
  // PoD's layer blocks (kv_cache.pod_blocks, checked against the model and the stages), for the sequences whose
  // policies share keys.
  void set_pod_blocks(PodBlocks blocks) { shard_.pod_blocks = std::move(blocks); }
  // Whether a request's policy (for every layer) can run on this shard's cache: throws std::invalid_argument,
  // as a sequence with it would, before the request is queued (routing/ answers 400).
  void check_request_policy(const PolicySpec& spec) const { shard_.check_request_policy(spec); }

 private:
  friend class OfflineExecutor;  // strata eval's and strata bench's door (rank/offline_executor.h)

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
  std::vector<float> logits_;          // the rows of the last execute() with keep_logits_ (OfflineExecutor)
  std::vector<RowSampling> sampling_;  // per work item of the step being executed (LogitsMode::sample)
  std::vector<RowSample> samples_;     // the tokens of the LogitsMode::sample items of the last execute()
  bool keep_logits_ = false;
};

}  // namespace strata
