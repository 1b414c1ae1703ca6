#pragma once
// Builds a rank's report after each step (parallel/rank_report.h): the KV state of its cache, what its compression
// policies did since the last report, the tokens it sampled, and, when the plan asks, its sequences' policy
// detail. Used alike by the leader (its own report) and by every other rank (rank/rank_worker.h).
#include <cstdint>
#include <set>
#include <span>

#include "cache/kv_cache.h"
#include "parallel/rank_grid.h"
#include "parallel/rank_report.h"
#include "rank/step_executor.h"

namespace strata {

// The KV part of a rank's report from its cache: pool, per-layer usage and what the cache stores of the policies'
// decisions (cache/storage_observations.h), and the per-layer entries and blocks of those of `seqs` the cache
// holds (no counts, no detail).
RankReport kv_report(const KvCache& cache, std::span<const SeqId> seqs);

class RankReporter {
 public:
  RankReporter(const RankGrid& grid, const KvCache& cache, StepExecutor& executor);

  // Follows the plan's sequences, so that a report lists those the cache holds. Call before executing it.
  void track(const StepPlan& plan);
  // The report of `plan`'s step. Takes the executor's compression counts (they restart from zero). `result`:
  // what the executor sampled; kept only on the last stage's first tensor rank.
  RankReport report(const StepPlan& plan, StepResult result);

 private:
  SequenceDetail detail(SeqId seq) const;

  RankGrid grid_;
  const KvCache& cache_;
  StepExecutor& executor_;
  std::set<SeqId> seqs_;  // ascending, so reports list sequences in order
};

}  // namespace strata
