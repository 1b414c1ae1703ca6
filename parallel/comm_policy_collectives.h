#pragma once
// The collectives compression policies need (cache/policy_collectives.h) over the rank's communicators: the
// tensor-parallel group of its stage for tp_all_reduce, and its pipeline chain (the ranks of the same tensor rank
// in every stage) for gather_layers.
#include "cache/policy_collectives.h"
#include "parallel/comm.h"

namespace strata {

class CommPolicyCollectives final : public PolicyCollectives {
 public:
  // tp: the stage's TP group (null: tp = 1); pp: the pipeline chain, group rank = stage (null: pp = 1). The stages'
  // layer ranges follow parallel/rank_grid.h's stage_layers.
  CommPolicyCollectives(Comm* tp, Comm* pp, int n_layers_total);

  // Every rank gathers the group's values and reduces them in rank order, so all get bitwise the same result.
  void tp_all_reduce(std::span<double> values, ReduceOp op) override;
  void gather_layers(std::span<double> values, int layer_begin, int layer_end) override;

 private:
  Comm* tp_;
  Comm* pp_;
  int n_layers_total_;
};

}  // namespace strata
