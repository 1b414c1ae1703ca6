#include "daemon/rank_world.h"

#include <cstdlib>
#include <iostream>
#include <vector>

namespace strata {

RankWorld::RankWorld(const ServerConfig& config) {
  const int tp = config.parallel.tp, pp = config.parallel.pp;
  if (!MpiWorld::launched()) {
    if (tp * pp != 1) {
      throw ConfigError(config.file + ": parallel.tp x parallel.pp = " + std::to_string(tp * pp) +
                        " ranks: start them with mpirun -np " + std::to_string(tp * pp) +
                        " (this process was started alone)");
    }
    return;
  }
  mpi_ = std::make_unique<MpiWorld>(nullptr, nullptr);
  try {
    grid_ = make_rank_grid(tp, pp, mpi_->size(), mpi_->rank());
  } catch (const std::invalid_argument& e) {
    throw ConfigError(config.file + ": " + e.what());
  }
  deadline_ = std::make_shared<CommDeadline>();
  deadline_->timeout = std::chrono::seconds(config.parallel.timeout_s);
  std::vector<std::string> names;
  for (int r = 0; r < grid_.world_size(); ++r) names.push_back(grid_.describe(r));
  // Collective on every rank, in this order.
  world_ = mpi_->split(0, names, "the world", deadline_);
  tp_ = mpi_->split(grid_.stage(), names, "the TP group of pp_stage " + std::to_string(grid_.stage()), deadline_);
  pp_ = mpi_->split(grid_.tp_rank(), names, "the pipeline of tp_rank " + std::to_string(grid_.tp_rank()), deadline_);
}

RankWorld::~RankWorld() {
  // The communicators go before MPI_Finalize (in ~MpiWorld).
  pp_.reset();
  tp_.reset();
  world_.reset();
}

void RankWorld::interrupt() {
  if (deadline_) deadline_->interrupted = true;
}

void RankWorld::abort(const std::string& message) {
  if (mpi_) MpiWorld::abort(message);
  std::cerr << message << std::endl;
  std::exit(1);
}

}  // namespace strata
