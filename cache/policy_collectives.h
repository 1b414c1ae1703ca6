#pragma once
// What compression policies need from the other ranks (design brief, section 4, rules 3 and 4), and nothing more:
//
// - tp_all_reduce: a decision that averages over ALL heads of a layer (SimLayerKV's lazy test, D2O's layer
//   statistic and its per-step merge threshold) reduces a few numbers over the tensor-parallel group of the
//   rank's stage: the ranks that hold the other heads of the same layers. Never a gather of tensors.
// - gather_layers: a decision that needs every layer (D2O's allocation over all layers) exchanges one number per
//   layer along the pipeline, once per request.
//
// Both are collectives: every rank of the group (tp_all_reduce) or of the world (gather_layers) makes the same
// calls, in the same order, with the same lengths. Policies call them only at points that every rank reaches for
// the same (sequence, layer): their hooks run on every rank for every sequence of the step plan, in the plan's
// order and in layer order, and whether a hook calls a collective depends only on what every rank knows alike
// (prompt length, step, layer lengths, which agree across the TP group by design rule 2).
//
// SingleRankCollectives is what a world of one uses: the group is the rank itself. The MPI implementation lives
// in parallel/ and is handed to the StepExecutor.
#include <span>

namespace strata {

enum class ReduceOp { sum, min, max };

class PolicyCollectives {
 public:
  virtual ~PolicyCollectives() = default;
  // Element-wise over the tensor-parallel group, in place: on return every rank holds the same values.
  virtual void tp_all_reduce(std::span<double> values, ReduceOp op) = 0;
  // One value per global layer, [n_layers_total]: on entry this rank has filled [layer_begin, layer_end) (its
  // stage's layers); on return every element holds the value of the stage that owns that layer. The TP ranks of
  // a stage provide identical values (they follow from tp_all_reduce).
  virtual void gather_layers(std::span<double> values, int layer_begin, int layer_end) = 0;
};

class SingleRankCollectives final : public PolicyCollectives {
 public:
  void tp_all_reduce(std::span<double>, ReduceOp) override {}
  void gather_layers(std::span<double>, int, int) override {}
};

// A stateless single-rank instance, the default of PolicyContext (unit tests, a world of one).
inline PolicyCollectives& single_rank_collectives() {
  static SingleRankCollectives instance;
  return instance;
}

}  // namespace strata
