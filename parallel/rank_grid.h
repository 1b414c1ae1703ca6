#pragma once
// Where a rank sits in the TP x PP grid (design brief, section 1): world rank r is pipeline stage r / tp and
// tensor rank r % tp, so that a stage's tensor-parallel group is a block of consecutive ranks (one node, NVLink).
// Rank 0 is the leader: HTTP, scheduling, the StepPlan.
#include <string>
#include <utility>

namespace strata {

struct RankGrid {
  int tp = 1;
  int pp = 1;
  int rank = 0;  // world rank

  int world_size() const { return tp * pp; }
  int stage() const { return rank / tp; }
  int tp_rank() const { return rank % tp; }
  bool is_leader() const { return rank == 0; }
  bool is_first_stage() const { return stage() == 0; }
  bool is_last_stage() const { return stage() == pp - 1; }
  int rank_of(int stage, int tp_rank) const { return stage * tp + tp_rank; }
  // "rank 3 (pp_stage 1, tp_rank 0)", for messages about any rank.
  std::string describe(int world_rank) const;
};

// Checks the degrees against the world the launcher started: tp, pp >= 1 and tp * pp == world_size. Throws
// std::invalid_argument naming --tp / --pp (parallel.tp / parallel.pp) and the world size otherwise.
RankGrid make_rank_grid(int tp, int pp, int world_size, int world_rank);

// The layers [begin, end) of a pipeline stage: contiguous ranges whose sizes differ by at most one, the earlier
// stages taking the extra layers (30 layers over 4 stages: 8, 8, 7, 7). std::invalid_argument when there are
// more stages than layers.
std::pair<int, int> stage_layers(int n_layers, int pp, int stage);

}  // namespace strata
