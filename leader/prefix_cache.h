#pragma once
// Automatic prefix caching, the leader's side: which cached blocks each sequence starts from, which of its prompt
// blocks it publishes, and which unused blocks go when the pool needs their memory, written into the step plan for
// every rank to carry out (parallel/step_plan.h). The index of blocks is leader/prefix_index.h; what a sequence's
// policies allow is cache/prefix_reuse.h.
//
// A sequence holds a use on every cached block it shares or published, from the step it is pinned (waiting for
// admission) until it finishes or is preempted; one that takes copies lets go of the originals once admitted.
// Blocks nobody uses stay cached until evicted.
//
// Compressed prefixes (cache/prefix_reuse.h, PrefixReuse::compressed_point): a sequence under query-agnostic
// policies, prefilled in chunks, publishes what its layers hold right after its prompt's last compression point,
// under compressed_block_chain(the prefix's hash, its policies), when that fills whole blocks; a later sequence
// whose prompt agrees up to its own last point finds them and shares them instead of prefilling and compressing
// that prefix. Its tail (the rest of the prompt: a question after a document) holds no compression point, so
// nothing ever writes into the shared blocks, and it gets what it gets alone. On a quantized pool the shared
// blocks are sealed groups: a chunked prefill seals at every compression point, before the blocks are published.
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "cache/compression_config.h"
#include "cache/compression_policy.h"
#include "cache/kv_cache.h"
#include "cache/prefix_reuse.h"
#include "leader/prefix_index.h"
#include "parallel/step_plan.h"

namespace strata {

struct PrefixCacheSettings {
  uint64_t salt = 0;              // whatever besides the tokens changes the KV: the model, the weights' and KV's types
  // Generated tokens' blocks are published too: false with a quantized pool, where a decode step attends to the
  // quantized entries before it, so its KV is not what a prefill of the same tokens writes.
  bool publish_generated = true;
};

class PrefixCache {
 public:
  // compression, context: the server's policies (for sequences whose request names none) and the model's shape
  // and name, to ask the policies what they allow.
  PrefixCache(int block_size, PrefixCacheSettings settings, CompressionConfig compression, PolicyContext context);

  // A sequence waiting for admission with none of its KV on the ranks: the leading cached blocks of its tokens (as
  // far as its policies allow) are pinned for it. Returns the tokens they hold, where its prefill will start.
  int pin(SeqId seq, std::span<const int32_t> tokens, int prefill_len, const std::optional<PolicySpec>& policy);
  // Whether the sequence starts from copies of its pinned blocks (its policies may rewrite entries): they take
  // pool blocks when it is admitted.
  bool copies(SeqId seq) const;
  // The sequence was admitted: the ranks start its KV from its pinned blocks.
  void start(StepPlan& plan, SeqId seq, int prefill_len);
  // A chunk of the sequence's tokens (prompt or generated) ends at `chunk_end`: the blocks it completes are
  // published; those of generated tokens only when its policies never rewrite entries (so that the next turn of a
  // chat finds its answer cached too).
  void publish(StepPlan& plan, SeqId seq, std::span<const int32_t> tokens, int chunk_end, int prefill_len);
  // The sequence finished or was preempted: its uses end.
  void release(SeqId seq);
  // The step's plan is complete (evictions included): the blocks that its new sequences copied may be evicted
  // from the next plan on.
  void plan_done();

  // Cached blocks no sequence uses (per layer of every stage): what evicting could give back.
  int64_t n_evictable() const { return index_.n_unused(); }
  // Evicts up to n unused blocks, least recently used first.
  void evict(StepPlan& plan, int64_t n);
  int64_t n_cached() const { return index_.size(); }
  // For /v1/kv_state: the cached blocks a sequence started from, and how many it published after them.
  struct SequenceBlocks {
    int started_from = 0;
    int published = 0;
    bool compressed = false;  // it started from a compressed prefix
  };
  SequenceBlocks blocks_of(SeqId seq) const;

 private:
  struct SequenceUse {
    std::vector<uint64_t> chain;   // hashes of the full blocks of its tokens
    std::vector<uint64_t> used;    // the cached blocks it holds a use on: those it shares, then those it published
    int n_started = 0;             // blocks it starts from (shared, or copied)
    int next_block = 0;            // the next of its blocks to publish
    int prefill_len = 0;
    PrefixReuse reuse;
    bool publishing = true;        // false once a block of its was found already published by another sequence
    // Its compressed prefix: the blocks' hashes (empty: none), the policies' text, and whether it started from them.
    std::vector<uint64_t> compressed;
    std::string policy;
    bool started_compressed = false;
  };
  // The compressed prefix the sequence's prefill (use.chain, use.reuse) may share or publish (use.compressed).
  void plan_compressed(SequenceUse& use, const std::optional<PolicySpec>& policy);
  void publish_compressed(StepPlan& plan, SeqId seq, SequenceUse& use, std::span<const int32_t> tokens,
                          int chunk_end);

  int block_size_;
  PrefixCacheSettings settings_;
  CompressionConfig compression_;
  PolicyContext policy_context_;
  PrefixIndex index_;
  std::unordered_map<SeqId, SequenceUse> uses_;
  std::vector<uint64_t> copied_;  // originals copied by this plan's new sequences, released by plan_done
};

}  // namespace strata
