#include "parallel/step_exchange.h"

#include <string>

namespace strata {

void StepExchange::publish(const StepPlan& plan) {
  std::vector<uint8_t> bytes = serialize(plan);
  world_.broadcast(bytes, 0);
}

StepPlan StepExchange::next_plan() {
  std::vector<uint8_t> bytes;
  world_.broadcast(bytes, 0);
  return deserialize_step_plan(bytes);
}

void StepExchange::reply(const RankReport& report) { world_.gather(serialize(report), 0); }

std::vector<RankReport> StepExchange::collect(RankReport own) {
  std::vector<std::vector<uint8_t>> bytes = world_.gather({}, 0);
  std::vector<RankReport> reports(bytes.size());
  for (size_t r = 0; r < bytes.size(); ++r) {
    reports[r] = r == 0 ? std::move(own) : deserialize_rank_report(bytes[r]);
    const RankReport& got = reports[r];
    if (got.world_rank != int(r) || got.step != reports[0].step) {
      throw std::runtime_error("rank report from rank " + std::to_string(r) + " says rank " +
                               std::to_string(got.world_rank) + ", step " + std::to_string(got.step) +
                               "; expected step " + std::to_string(reports[0].step));
    }
  }
  for (const RankReport& got : reports) {
    if (!got.error.empty()) {
      throw RankFailure("rank " + std::to_string(got.world_rank) + " (pp_stage " + std::to_string(got.pp_stage) +
                        ", tp_rank " + std::to_string(got.tp_rank) + "): " + got.error);
    }
  }
  return reports;
}

}  // namespace strata
