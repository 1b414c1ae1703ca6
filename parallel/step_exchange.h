#pragma once
// The messages of one engine step between the leader and the other ranks, over the world communicator:
//
//   leader: publish(plan) ──broadcast──► every other rank: next_plan()
//   every rank executes the plan on its shard
//   every other rank: reply(report) ──gather──► leader: collect(own report) -> the reports of all ranks
//
// The reports carry the sampled tokens (last stage, tensor rank 0), the KV state for the scheduler and /metrics,
// and any error a rank hit. Every wait is bounded (parallel/comm.h): the leader learns of a rank that stops
// answering from collect(), a rank learns of a silent leader from next_plan(). When idle the leader publishes
// empty plans (heartbeats) so that silence means failure.
#include <vector>

#include "parallel/comm.h"
#include "parallel/rank_report.h"
#include "parallel/step_plan.h"

namespace strata {

class StepExchange {
 public:
  explicit StepExchange(Comm& world) : world_(world) {}

  void publish(const StepPlan& plan);
  StepPlan next_plan();
  void reply(const RankReport& report);
  // By world rank; `own` is the leader's. Throws RankFailure naming the rank when a rank reports an error, and
  // std::runtime_error when a report is malformed or from another step.
  std::vector<RankReport> collect(RankReport own);

 private:
  Comm& world_;
};

}  // namespace strata
