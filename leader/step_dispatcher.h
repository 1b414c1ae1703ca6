#pragma once
// The leader's side of an engine step: every rank of the world executes the plan on its shard (the leader's own
// shard included) and reports back (parallel/step_exchange.h). With a world of one there is nobody to talk to
// and the plan goes straight to the local executor. The engine steps every 100 ms even when idle, and those empty
// steps are the heartbeat by which the other ranks know the leader is alive.
#include <vector>

#include "cache/kv_cache.h"
#include "leader/pipeline_kv.h"
#include "parallel/rank_grid.h"
#include "parallel/step_exchange.h"
#include "rank/rank_reporter.h"
#include "rank/step_executor.h"

namespace strata {

class StepDispatcher {
 public:
  // exchange: null for a world of one. Exchanges a first (empty) step so that every rank's report is known.
  StepDispatcher(const RankGrid& grid, StepExecutor& executor, const KvCache& cache, StepExchange* exchange);

  // Every rank executes the plan; returns what the last stage sampled. Throws RankFailure when a rank failed or
  // did not answer: the world cannot go on.
  StepResult execute(const StepPlan& plan);
  // The other ranks leave their loop. Throws RankFailure when they cannot be told.
  void shutdown();

  const RankGrid& grid() const { return grid_; }
  // The reports of the last step, by world rank.
  const std::vector<RankReport>& reports() const { return reports_; }
  // The scheduler's view of every stage's KV blocks after the last step.
  PipelineKv pipeline_kv() const;

 private:
  RankGrid grid_;
  StepExecutor& executor_;
  RankReporter reporter_;
  StepExchange* exchange_;
  uint64_t last_step_ = 0;
  std::vector<RankReport> reports_;
};

}  // namespace strata
