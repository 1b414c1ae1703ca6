#pragma once
// Builds a rank's report after each step (parallel/rank_report.h): the KV state of its cache, what its compression
// policies did since the last report, and the tokens it sampled. Used alike by the leader (its own report) and by
// every other rank (daemon/rank_worker.h).
#include <cstdint>
#include <set>

#include "cache/kv_cache.h"
#include "daemon/step_executor.h"
#include "parallel/rank_grid.h"
#include "parallel/rank_report.h"

namespace strata {

class RankReporter {
 public:
  RankReporter(const RankGrid& grid, const KvCache& cache, StepExecutor& executor);

  // Follows the plan's sequences, so that a report lists those the cache holds. Call before executing it.
  void track(const StepPlan& plan);
  // Takes the executor's compression counters (they restart from zero). `result`: what the executor sampled; kept
  // only on the last stage's first tensor rank.
  RankReport report(uint64_t step, StepResult result);

 private:
  RankGrid grid_;
  const KvCache& cache_;
  StepExecutor& executor_;
  std::set<SeqId> seqs_;  // ascending, so reports list sequences in order
};

}  // namespace strata
