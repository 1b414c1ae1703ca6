#pragma once
// What the leader (rank 0) decides each engine iteration, and what the ranks report back. The leader builds a
// StepPlan, broadcasts it, and every rank executes it on its shard (rank/step_executor.h); the last pipeline
// stage samples and returns a StepResult. Both are plain structs with a byte serialisation for the wire.
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cache/policy_spec.h"
#include "kernels/token_sampling.h"

namespace strata {

// A sequence the ranks have not seen before. Sampling state is created from it on the sampling rank(s).
struct PlannedSequence {
  int64_t seq = 0;
  SamplingRule sampling;
  uint64_t seed = 0;        // the RNG seed (the request's, or one the leader drew): every TP rank agrees
  std::optional<PolicySpec> kv_policy;  // the request's policy (validated by the HTTP layer); none: the server's
  int32_t prompt_len = 0;
};

// Tokens one sequence processes in this step: a prefill chunk, or the single token of a decode step.
struct PlannedWork {
  int64_t seq = 0;
  int32_t start_pos = 0;
  std::vector<int32_t> tokens;
  bool sample = false;      // the chunk ends the known tokens: sample the next one
  int32_t prefill_len = 0;  // a prefill chunk: the length of the prefill it belongs to (the prompt, or all known
                            // tokens when a preempted sequence is recomputed); 0: a decode step
  // Empty: no constraint; else the mask of the token this work samples (kernels/token_mask_layout.h:
  // mask_words(vocab) words), only where sample is set. "= {}" lets the brace initialisers that stop before it
  // compile without -Wmissing-field-initializers.
  std::vector<uint64_t> allowed = {};
  // Chunked prefill: the last n_scoring of tokens are not the chunk's but its scoring rows (the prefill's last
  // tokens, or the chunk's reconstruction: cache/scoring_tokens.h), run after a chunk that ends at a compression
  // point before the prefill's end, at the positions that follow it, for their attention only; the ranks drop
  // their entries after the compression.
  int32_t n_scoring = 0;
};

// Appends a chunk's scoring rows to its work (PlannedWork::n_scoring).
void append_scoring_rows(PlannedWork& work, std::span<const int32_t> rows);

// Prefix caching (leader/prefix_index.h): a cached block is named by its hash, and every rank of a stage holds
// it as one KV block per local layer (cache/kv_cache.h).
struct PrefixStart {
  int64_t seq = 0;
  std::vector<uint64_t> blocks;  // the cached blocks its KV starts with, a chain in order
  int32_t prefill_len = 0;       // the prefill whose first chunk follows them
  bool copy = false;             // its policies may rewrite entries: it takes copies instead of sharing them
  // A compressed prefix (blocks published with PrefixPublish::compressed): the prompt tokens the blocks stand for,
  // where the prefill's first chunk starts; 0: the blocks' own tokens.
  int32_t position = 0;
  bool operator==(const PrefixStart&) const = default;
};
struct PrefixPublish {
  int64_t seq = 0;
  int32_t index = 0;  // the sequence's block: entries [index * block_size, (index + 1) * block_size)
  uint64_t hash = 0;
  // A block of a compressed prefix (KvCache::publish_compressed), published after the policies' hooks, which
  // compressed it; otherwise before them, as the forward pass wrote it.
  bool compressed = false;
  bool operator==(const PrefixPublish&) const = default;
};

struct StepPlan {
  uint64_t step = 0;
  std::vector<uint64_t> prefix_evicted;  // first of all: cached blocks the ranks let go of
  std::vector<PlannedSequence> added;
  std::vector<int64_t> preempted;  // give back their KV blocks; they come back later as new work from position 0
  std::vector<int64_t> finished;   // give back their KV blocks and forget their sampling state
  std::vector<PrefixStart> prefix_started;      // then: sequences whose KV starts with cached blocks
  std::vector<PlannedWork> work;
  std::vector<PrefixPublish> prefix_published;  // after the forward pass, before the policies' hooks (compressed
                                                // blocks: after them)
  bool report_detail = false;  // every rank adds its sequences' policy detail to its report (/v1/kv_state asked)
  bool shutdown = false;
};

struct SampledToken {
  int64_t seq = 0;
  RowSample sample;  // the token, its logprob and the requested alternatives (kernels/token_sampling.h)
};

struct StepResult {
  uint64_t step = 0;
  std::vector<SampledToken> sampled;
};

std::vector<uint8_t> serialize(const StepPlan& plan);
StepPlan deserialize_step_plan(const std::vector<uint8_t>& bytes);   // throws std::runtime_error when malformed
std::vector<uint8_t> serialize(const StepResult& result);
StepResult deserialize_step_result(const std::vector<uint8_t>& bytes);

}  // namespace strata
