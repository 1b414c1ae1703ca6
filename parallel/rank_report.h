#pragma once
// What every rank tells the leader after each step (design brief, section 1: "small reports"): its KV pool, the
// per-layer occupancy of its shard and what its compression policies did and report, as named values (for the
// scheduler's admission over every pipeline stage, and for /metrics with the rank's pp_stage and tp_rank labels),
// the per-sequence lengths the scheduler needs, the tokens it sampled (the last stage's first tensor rank), or the
// error that stopped it.
// Per-sequence policy detail (for /v1/kv_state) comes only in the report of a step whose plan asked for it.
// Plain data with a byte encoding.
#include <cstdint>
#include <string>
#include <vector>

#include "cache/kv_cache.h"
#include "cache/observation.h"
#include "parallel/step_plan.h"

namespace strata {

// One layer of the rank's shard, over all sequences.
struct LayerReport {
  LayerUsage usage;
  int64_t evicted_tokens = 0;  // entries the policies removed since the previous report
  // What the policies and the cache's storage of their decisions report about the layer, by name
  // (cache/observation.h): counts since the previous report (a policy's counts grown, its verdicts taken) and
  // amounts now. /metrics feeds them to the series declared under their names (cache/layer_metric.h).
  std::vector<Observation> observations;
};

// One sequence's lengths on the rank, per local layer: what the scheduler counts blocks with. Sent by the first
// tensor rank of each stage only (its TP peers hold the same lengths, design rule 2).
struct SequenceKv {
  int64_t seq = 0;
  std::vector<int32_t> entries;  // entries held (after compression)
  std::vector<int32_t> blocks;   // blocks in the block table
  int64_t blocks_held = 0;       // blocks releasing the sequence gives back (KvCache::blocks_held: in a quantized
                                 // pool, quantized blocks share slots and count only as whole slots)
};

// One layer of one sequence as /v1/kv_state shows it: what the cache holds beyond the lengths, and what the
// layer's policy reports.
struct SequenceLayerDetail {
  std::string policy;                     // the spec in effect; empty before the prefill starts
  int32_t appended = 0;                   // entries ever appended (what `full` would hold)
  std::vector<Observation> observations;  // the policy's (CompressionPolicy::observe) and the cache's storage's
};

struct SequenceDetail {
  int64_t seq = 0;
  std::vector<SequenceLayerDetail> layers;  // per local layer
};

struct RankReport {
  uint64_t step = 0;
  int32_t world_rank = 0;
  int32_t pp_stage = 0;
  int32_t tp_rank = 0;
  int32_t layer_begin = 0;        // layers[i] is global layer layer_begin + i
  int32_t block_size = 0;         // tokens per KV block
  int64_t block_bytes = 0;
  int64_t blocks_free = 0;
  int64_t blocks_total = 0;
  std::vector<LayerReport> layers;
  std::vector<SequenceKv> sequences;    // ascending seq
  std::vector<SequenceDetail> details;  // ascending seq; only when the plan asked (StepPlan::report_detail)
  StepResult result;              // the sampled tokens (the last stage's tp_rank 0); empty elsewhere
  std::string error;              // non-empty: the rank could not execute the step (the message names why)
};

std::vector<uint8_t> serialize(const RankReport& report);
RankReport deserialize_rank_report(const std::vector<uint8_t>& bytes);  // std::runtime_error when malformed

}  // namespace strata
