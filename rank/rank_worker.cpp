#include "rank/rank_worker.h"

#include <exception>
#include <string>

#include "rank/rank_reporter.h"

namespace strata {
namespace {

// Returns on the shutdown plan; throws RankFailure when the world cannot go on.
void step_loop(StepExchange& exchange, StepExecutor& executor, RankReporter& reporter) {
  for (;;) {
    const StepPlan plan = exchange.next_plan();
    if (plan.shutdown) return;
    reporter.track(plan);
    StepResult result;
    std::string error;
    try {
      result = executor.execute(plan);
    } catch (const RankFailure&) {
      throw;
    } catch (const std::exception& e) {
      error = e.what();
    }
    RankReport report = reporter.report(plan, std::move(result));
    report.error = error;
    exchange.reply(report);
    if (!error.empty()) {
      // The leader fails the requests and ends the world on this report; wait for that (its abort ends this
      // process) rather than end it first and cut the requests' error responses short. Anything else from the
      // leader, or its silence past the deadline, ends it from here.
      exchange.next_plan();
      throw RankFailure("the leader went on after this rank's failure: " + error);
    }
  }
}

}  // namespace

void run_worker(const RankGrid& grid, StepExchange& exchange, StepExecutor& executor, const KvCache& cache,
                const std::function<void(const std::string& message)>& end_world) {
  RankReporter reporter(grid, cache, executor);
  try {
    step_loop(exchange, executor, reporter);
  } catch (const std::exception& e) {
    end_world("strata: " + grid.describe(grid.rank) + ": " + e.what() + "; ending the world");
  }
}

}  // namespace strata
