#include "leader/step_dispatcher.h"

#include <stdexcept>

namespace strata {

StepDispatcher::StepDispatcher(const RankGrid& grid, StepExecutor& executor, const KvCache& cache,
                               StepExchange* exchange)
    : grid_(grid), executor_(executor), reporter_(grid, cache, executor), exchange_(exchange) {
  if (grid.world_size() > 1 && exchange == nullptr) {
    throw std::invalid_argument("step dispatcher: a world of " + std::to_string(grid.world_size()) +
                                " ranks needs a step exchange");
  }
  execute(StepPlan{});
}

StepResult StepDispatcher::execute(const StepPlan& plan) {
  reporter_.track(plan);
  last_step_ = plan.step;
  if (!exchange_) {
    StepResult own = executor_.execute(plan);
    reports_.assign(1, reporter_.report(plan, std::move(own)));
    return reports_[0].result;
  }
  exchange_->publish(plan);
  // With other ranks a step that fails anywhere leaves the shards in states that may no longer agree: the
  // leader's own error goes into its report, and collect() turns it into a RankFailure like any other rank's.
  StepResult own;
  std::string error;
  try {
    own = executor_.execute(plan);
  } catch (const RankFailure&) {
    throw;
  } catch (const std::exception& e) {
    error = e.what();
  }
  RankReport report = reporter_.report(plan, std::move(own));
  report.error = std::move(error);
  reports_ = exchange_->collect(std::move(report));
  return reports_.at(size_t(grid_.rank_of(grid_.pp - 1, 0))).result;
}

void StepDispatcher::shutdown() {
  if (exchange_ == nullptr) return;
  StepPlan plan;
  plan.step = last_step_;
  plan.shutdown = true;
  exchange_->publish(plan);
}

PipelineKv StepDispatcher::pipeline_kv() const {
  std::vector<RankReport> stages;
  for (int s = 0; s < grid_.pp; ++s) stages.push_back(reports_.at(size_t(grid_.rank_of(s, 0))));
  return PipelineKv(std::move(stages));
}

}  // namespace strata
