#pragma once
// One sequence's KV compression on this rank: the policies of its local layers (built when a prefill starts),
// the attention statistics they ask the forward pass for, their hooks after the step, and what their decisions do
// to the cache: merges and compaction, codebooks, sealing for quantization, PoD's key freeing, the cross-layer
// step. Policies are known by what they declare (CompressionPolicy::traits), never by name.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cache/compression_config.h"
#include "cache/compression_policy.h"
#include "cache/kv_cache.h"
#include "cache/pod_blocks.h"
#include "cache/policy_collectives.h"
#include "model/llama_model.h"
#include "parallel/rank_report.h"
#include "parallel/step_plan.h"
#include "rank/layer_compression_counts.h"

namespace strata {

// What the compression of every sequence on the rank shares: the shard, the server's configuration, and the
// counts of what the policies did since the last report.
struct ShardCompression {
  ShardCompression(LlamaModel& model, KvCache& cache, CompressionConfig config, std::string model_name,
                   PolicyCollectives& collectives);

  PolicyContext context(int global_layer) const;
  // Throws std::invalid_argument when a policy with these traits cannot run here: it needs a full-precision pool
  // and the pool is quantized, or it shares keys and kv_cache.pod_blocks is not set.
  // Also when kv_cache.prefill_compression is chunked and the policy has no chunked form, or end and the policy
  // needs chunks (under auto a sequence runs as its policies allow).
  void check_fits(const PolicyTraits& traits, const std::string& policy_name) const;
  // check_fits for a request's policy, which replaces the server's in every layer.
  void check_request_policy(const PolicySpec& spec) const;
  int local(int global_layer) const { return global_layer - cache.layer_begin(); }

  LlamaModel& model;
  KvCache& cache;
  CompressionConfig config;
  std::string model_name;
  PolicyCollectives& collectives;
  std::optional<PodBlocks> pod_blocks;             // kv_cache.pod_blocks, for sequences whose policy shares keys
  std::vector<LayerCompressionCounts> counts;      // per local layer, since the last report
};

class SequenceCompression {
 public:
  // request_policy: the request's spec, replacing the server's configuration for every layer.
  SequenceCompression(ShardCompression& shard, SeqId seq, std::optional<PolicySpec> request_policy);

  // A prefill of prefill_len entries starts at position 0 (the prompt, or a preempted sequence's recompute):
  // builds every local layer's policy and the prefill statistics they ask for. Throws std::invalid_argument when
  // the policies do not fit the cache (a quantized pool, PoD without its blocks or in only some layers).
  void start_prefill(int prefill_len);
  // The sequence was preempted: its policies start again with the recompute's prefill.
  void forget_policies();

  // strata eval's shared prefill (eval/shared_prefill.h). sum_every_prompt_row(), before the prefill starts: the
  // prefill sums every prompt row's attention in every layer, whatever the policies ask, and keeps the sums after
  // the prompt's end (prompt_statistics()) for the sequences forked from it.
  void sum_every_prompt_row() { sums_every_prompt_row_ = true; }
  const AttentionStats* prompt_statistics() const { return sums_every_prompt_row_ ? prefill_stats_.get() : nullptr; }
  // The prompt of prefill_len entries is in the cache already, copied from a sequence that summed every prompt row
  // (its prompt_statistics()): builds the policies, gives each the rows it asks for, and runs what the prompt's
  // end runs. Throws std::invalid_argument when a layer asks for rows from a position after the first (its sums
  // would differ); such a sequence forks before those rows and computes them itself.
  void start_prefilled(int prefill_len, const AttentionStats& source);

  // The statistics the forward pass sums for this step's work (owned here until after_step), or null.
  AttentionStats* stats_for(const PlannedWork& work);
  // PoD's blocks of this sequence, or null.
  const PodSequence* pod() const { return pod_.get(); }
  // After the forward pass: the hooks at the prompt's end and after each decode step, and what they decided.
  void after_step(const PlannedWork& work);

  // Per local layer: the spec in effect and what its policy reports (CompressionPolicy::observe; what the cache
  // holds is the reporter's). Empty before the first prefill starts.
  std::vector<SequenceLayerDetail> detail() const;

 private:
  const PolicySpec& spec_for(int global_layer) const;
  PolicyContext context(int global_layer) const;  // the shard's, with this sequence's prefill chunk
  std::unique_ptr<PodSequence> pod_sequence() const;
  void check_fits_the_cache() const;
  std::unique_ptr<AttentionStats> prefill_stats() const;
  std::unique_ptr<AttentionStats> decode_stats(const PlannedWork& work) const;
  LayerState layer_state(int global_layer, const AttentionStats* stats, int n_generated) const;
  // Where a step's work leaves the sequence.
  struct StepEnd {
    bool prefill_end = false;  // the prompt's last chunk
    bool chunk_point = false;  // chunked prefill: a compression point that is not the prompt's end
    bool decode = false;       // a decode step
    int n_generated = 0;       // tokens generated (at a decode step)
    int work_end = 0;          // the position after the work's last token (its scoring rows not counted)
    int n_scoring = 0;         // the work's scoring rows (PlannedWork::n_scoring)
  };
  StepEnd step_end(const PlannedWork& work) const;
  void run_hooks(const StepEnd& end);
  void check_scoring_rows(const PlannedWork& work) const;
  void compress_chunk(int point, int n_scoring);
  void drop_scoring_rows(size_t local, int global_layer, int n_entries, int n_scoring);
  void keep_prefill_sums(size_t local, const Selection& keep);
  void restart_prefill_rows(int chunk_begin);
  void cross_layer_step();
  void seal_groups(const StepEnd& end);
  void free_distant_keys(const StepEnd& end);
  void count_observations();
  void apply(int global_layer, int n_entries, const std::optional<Selection>& keep);

  ShardCompression& shard_;
  SeqId seq_;
  std::optional<PolicySpec> request_policy_;
  CompressionConfig config_;  // the server's, with kv_cache.prefill_compression auto decided for this sequence
  int prefill_len_ = 0;  // of the current prefill
  // The prompt position at which the next prefill compression runs (CompressionConfig::compression_point), and
  // whether the policies are asked again which prefill rows they want (after a chunked compression).
  int next_compression_ = 0;
  bool ask_rows_again_ = false;
  int scoring_rows_ = 0;  // of every work that reaches a compression point before the prefill's end
                          // (cache/prefill_footprint.h, prefill_scoring_rows)
  std::vector<std::unique_ptr<CompressionPolicy>> policies_;  // per local layer, built when a prefill starts
  std::vector<std::vector<Observation>> counted_;             // per local layer: what its policy reported when
                                                              // last counted (count_observations)
  bool cross_layer_ = false;  // a layer of the model, on any stage, takes part in the cross-layer step
  bool sums_every_prompt_row_ = false;
  std::unique_ptr<AttentionStats> prefill_stats_;  // across the chunks of a prefill
  std::unique_ptr<AttentionStats> decode_stats_;   // of the current decode step
  std::unique_ptr<PodSequence> pod_;
};

}  // namespace strata
