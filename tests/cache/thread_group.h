#pragma once
// An in-process tensor-parallel group for policy tests: each thread is a rank, and tp_all_reduce combines the
// values of all ranks as an MPI all-reduce would (cache/policy_collectives.h).
#include <algorithm>
#include <barrier>
#include <span>
#include <vector>

#include "cache/policy_collectives.h"

namespace strata::test {

class ThreadGroup {
 public:
  explicit ThreadGroup(int n_ranks) : barrier_(n_ranks), slots_(size_t(n_ranks)) {}

  void reduce(int rank, std::span<double> values, ReduceOp op) {
    slots_[size_t(rank)].assign(values.begin(), values.end());
    barrier_.arrive_and_wait();
    for (size_t i = 0; i < values.size(); ++i) {
      double acc = slots_[0][i];
      for (size_t k = 1; k < slots_.size(); ++k) {
        const double x = slots_[k][i];
        acc = op == ReduceOp::sum ? acc + x : op == ReduceOp::min ? std::min(acc, x) : std::max(acc, x);
      }
      values[i] = acc;
    }
    barrier_.arrive_and_wait();  // nobody overwrites a slot before every rank has read them all
  }

 private:
  std::barrier<> barrier_;
  std::vector<std::vector<double>> slots_;
};

class GroupRank final : public PolicyCollectives {
 public:
  GroupRank(ThreadGroup& group, int rank) : group_(group), rank_(rank) {}
  void tp_all_reduce(std::span<double> values, ReduceOp op) override { group_.reduce(rank_, values, op); }
  void gather_layers(std::span<double>, int, int) override {}

 private:
  ThreadGroup& group_;
  int rank_;
};

}  // namespace strata::test
