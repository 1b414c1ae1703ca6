#pragma once
// The life of every rank but the leader after loading: wait for the next plan, execute it on the shard, report,
// until the leader's shutdown plan. A step this rank cannot execute is reported to the leader, which fails the
// requests in flight and ends the world; a leader that falls silent ends it from here.
#include "cache/kv_cache.h"
#include "daemon/rank_world.h"
#include "daemon/step_executor.h"
#include "parallel/step_exchange.h"

namespace strata {

// Returns on the shutdown plan. When the world can no longer go on, ends it (RankWorld::abort) with a message
// naming this rank and what failed.
void run_worker(RankWorld& world, StepExchange& exchange, StepExecutor& executor, const KvCache& cache);

}  // namespace strata
