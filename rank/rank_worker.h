#pragma once
// The life of every rank but the leader after loading: wait for the next plan, execute it on the shard, report,
// until the leader's shutdown plan. A step this rank cannot execute is reported to the leader, which fails the
// requests in flight and ends the world; a leader that falls silent ends it from here.
#include <functional>
#include <string>

#include "cache/kv_cache.h"
#include "parallel/rank_grid.h"
#include "parallel/step_exchange.h"
#include "rank/step_executor.h"

namespace strata {

// Returns on the shutdown plan. When the world can no longer go on, calls end_world (the launcher's abort,
// daemon/rank_world.h) with a message naming this rank and what failed.
void run_worker(const RankGrid& grid, StepExchange& exchange, StepExecutor& executor, const KvCache& cache,
                const std::function<void(const std::string& message)>& end_world);

}  // namespace strata
