#include "parallel/rank_grid.h"

#include <algorithm>
#include <stdexcept>

namespace strata {

std::string RankGrid::describe(int world_rank) const {
  return "rank " + std::to_string(world_rank) + " (pp_stage " + std::to_string(world_rank / tp) + ", tp_rank " +
         std::to_string(world_rank % tp) + ")";
}

RankGrid make_rank_grid(int tp, int pp, int world_size, int world_rank) {
  if (tp < 1) throw std::invalid_argument("--tp (parallel.tp): expected an integer >= 1, got " + std::to_string(tp));
  if (pp < 1) throw std::invalid_argument("--pp (parallel.pp): expected an integer >= 1, got " + std::to_string(pp));
  if (tp * pp != world_size) {
    throw std::invalid_argument("--tp " + std::to_string(tp) + " x --pp " + std::to_string(pp) + " = " +
                                std::to_string(tp * pp) + " ranks, but the launcher started " +
                                std::to_string(world_size) + " (mpirun -np " + std::to_string(tp * pp) + ")");
  }
  if (world_rank < 0 || world_rank >= world_size) {
    throw std::invalid_argument("world rank " + std::to_string(world_rank) + " is outside [0, " +
                                std::to_string(world_size) + ")");
  }
  return RankGrid{tp, pp, world_rank};
}

std::pair<int, int> stage_layers(int n_layers, int pp, int stage) {
  if (pp > n_layers) {
    throw std::invalid_argument("--pp (parallel.pp) " + std::to_string(pp) + ": the model has only " +
                                std::to_string(n_layers) + " layers, one stage needs at least one");
  }
  if (stage < 0 || stage >= pp) {
    throw std::invalid_argument("pipeline stage " + std::to_string(stage) + " out of range");
  }
  const int base = n_layers / pp, extra = n_layers % pp;
  const int begin = stage * base + std::min(stage, extra);
  return {begin, begin + base + (stage < extra ? 1 : 0)};
}

}  // namespace strata
