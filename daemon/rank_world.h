#pragma once
// The process's place in the world. Alone (a plain `strata serve`): a world of one, no MPI at all. Started by a
// launcher (mpirun, srun): MPI, the TP x PP grid from parallel.tp / parallel.pp (N must equal tp * pp), and the
// communicators: the world, the stage's tensor-parallel group, and the pipeline chain of this tensor rank.
#include <memory>
#include <string>

#include "daemon/server_config.h"
#include "parallel/comm.h"
#include "parallel/mpi_comm.h"
#include "parallel/rank_grid.h"

namespace strata {

class RankWorld {
 public:
  // Throws ConfigError naming parallel.tp / parallel.pp when the grid does not match the world.
  explicit RankWorld(const ServerConfig& config);
  ~RankWorld();

  const RankGrid& grid() const { return grid_; }
  bool distributed() const { return grid_.world_size() > 1; }
  // Null when alone (or, for tp and pp, when the group is this rank alone).
  Comm* world() const { return world_.get(); }
  Comm* tp() const { return grid_.tp > 1 ? tp_.get() : nullptr; }
  Comm* pp() const { return grid_.pp > 1 ? pp_.get() : nullptr; }
  // The deadline and interruption switch every communicator of this process shares (null when alone).
  std::shared_ptr<CommDeadline> deadline() const { return deadline_; }
  // Makes every wait of every communicator give up now (shutdown; safe from any thread, not from a signal handler).
  void interrupt();
  // Tells the world it is over: MPI_Abort after printing `message` (a world of one: std::exit). Any thread.
  [[noreturn]] void abort(const std::string& message);

 private:
  RankGrid grid_;
  std::unique_ptr<MpiWorld> mpi_;
  std::shared_ptr<CommDeadline> deadline_;
  std::unique_ptr<MpiComm> world_, tp_, pp_;
};

}  // namespace strata
