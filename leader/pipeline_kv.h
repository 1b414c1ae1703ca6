#pragma once
// The KV blocks of every pipeline stage, as the leader's scheduler sees them. Each stage has its own pool and
// holds its own layers, and compression gives its layers their own lengths, so a step fits only when it fits in
// every stage. The view is built from the stages' reports after each step (parallel/rank_report.h); the tensor
// ranks of a stage hold identical block tables (design rule 2), so one report per stage is enough.
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "cache/kv_cache.h"
#include "parallel/rank_report.h"

namespace strata {

class PipelineKv {
 public:
  // One report per stage, in stage order. std::invalid_argument when empty or the block sizes differ.
  explicit PipelineKv(std::vector<RankReport> stages);

  int n_stages() const { return int(stages_.size()); }
  int block_size() const { return stages_[0].block_size; }
  int n_layers(int stage) const { return int(stages_.at(size_t(stage)).layers.size()); }
  int64_t n_free(int stage) const { return stages_.at(size_t(stage)).blocks_free; }
  int64_t n_total(int stage) const { return stages_.at(size_t(stage)).blocks_total; }
  // Counts n more blocks free on `stage` (cached blocks that could be evicted, for the scheduler).
  void add_free(int stage, int64_t n) { stages_.at(size_t(stage)).blocks_free += n; }
  // New blocks that appending n_new entries to every layer of seq would take on `stage` (seq may be unknown: new),
  // as KvCache::blocks_to_append counts them.
  int64_t blocks_to_append(int stage, SeqId seq, int n_new) const;
  // Blocks that releasing seq gives back on `stage` (KvCache::blocks_held).
  int64_t blocks_held(int stage, SeqId seq) const;
  // Blocks that a new sequence holding entries[l] entries in every global layer l takes on `stage`.
  int64_t blocks_for_entries(int stage, std::span<const int> entries) const;

 private:
  const SequenceKv* find(int stage, SeqId seq) const;

  std::vector<RankReport> stages_;
  std::vector<std::unordered_map<SeqId, size_t>> index_;  // per stage: seq -> position in stages_[s].sequences
};

}  // namespace strata
