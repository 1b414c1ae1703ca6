#pragma once
// What every rank tells the leader after each step (design brief, section 1: "small reports"): its KV pool and the
// per-layer occupancy of its shard (for the scheduler's admission over every pipeline stage, and for /metrics with
// the rank's pp_stage and tp_rank labels), what its compression policies did, the tokens it sampled (the last
// stage's first tensor rank), or the error that stopped it. Plain data with a byte encoding.
#include <cstdint>
#include <string>
#include <vector>

#include "parallel/step_plan.h"

namespace strata {

// One layer of the rank's shard, over all sequences.
struct LayerReport {
  int64_t tokens = 0;               // entries held
  int64_t blocks = 0;
  int64_t bytes = 0;                // the pool memory the layer's blocks take
  int64_t uncompressed_bytes = 0;   // what the same sequences would take with `full`
  int64_t evicted_tokens = 0;       // since the previous report
  int64_t lazy_decisions = 0;       // SimLayerKV verdicts since the previous report
  int64_t not_lazy_decisions = 0;
  int64_t merged_tokens = 0;        // D2O merges since the previous report
  int64_t codebook_vectors = 0;     // SpindleKV: codebook entries held (every sequence, KV head, K and V)
  int64_t shared_keys = 0;          // PoD: entries whose keys the layer does not hold (its leader's are used)
};

// One sequence on the rank: per local layer, what the KV cache holds and what its policy decided. Sent by the
// first tensor rank of each stage only (its TP peers hold the same lengths, design rule 2).
struct SequenceReport {
  int64_t seq = 0;
  std::vector<int32_t> entries;     // per local layer: entries held (after compression)
  std::vector<int32_t> appended;    // per local layer: entries ever appended (what `full` would hold)
  std::vector<int32_t> blocks;      // per local layer: blocks in the block table
  int64_t blocks_held = 0;          // blocks releasing the sequence gives back (KvCache::blocks_held: in a
                                    // quantized pool, quantized blocks share slots and count only as whole slots)
  std::vector<int8_t> lazy;         // per local layer: SimLayerKV's verdict, -1 while none
  std::vector<int32_t> capacity;    // per local layer: the most entries the policy allows (D2O), -1 while none
  std::vector<int64_t> merged;      // per local layer: entries merged into kept ones so far (D2O)
  std::vector<int64_t> codebook_keys;    // per local layer: SpindleKV codebook entries, keys (all KV heads)
  std::vector<int64_t> codebook_values;  // and values
  std::vector<int64_t> shared_keys;      // per local layer: PoD entries without their own keys
  std::vector<std::string> policy;  // per local layer: the policy spec in effect; empty before the prefill
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
  std::vector<SequenceReport> sequences;  // ascending seq
  StepResult result;              // the sampled tokens (the last stage's tp_rank 0); empty elsewhere
  std::string error;              // non-empty: the rank could not execute the step (the message names why)
};

std::vector<uint8_t> serialize(const RankReport& report);
RankReport deserialize_rank_report(const std::vector<uint8_t>& bytes);  // std::runtime_error when malformed

}  // namespace strata
