#pragma once
// What every rank does with a StepPlan: create and forget per-sequence state, free the blocks of preempted and
// finished sequences, run its shard of the forward pass, sample (on the last stage), and run the compression
// policies' hooks on its own layers. With one rank the leader calls it directly.
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "cache/compression_policy.h"
#include "cache/kv_cache.h"
#include "daemon/sampler.h"
#include "model/llama_model.h"
#include "parallel/step_plan.h"

namespace strata {

class StepExecutor {
 public:
  StepExecutor(LlamaModel& model, KvCache& cache);

  StepResult execute(const StepPlan& plan);
  // Sequences whose sampling state this rank holds.
  size_t n_sequences() const { return seqs_.size(); }

 private:
  struct SequenceState {
    SequenceSampler sampler;
    int prompt_len;
    std::vector<std::unique_ptr<CompressionPolicy>> policies;  // one per local layer
  };
  void run_policy_hooks(const PlannedWork& work, SequenceState& state);

  LlamaModel& model_;
  KvCache& cache_;
  std::unordered_map<int64_t, SequenceState> seqs_;
  std::vector<float> logits_;
};

}  // namespace strata
