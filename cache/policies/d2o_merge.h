#pragma once
// D2O's token-level compensation (../shared/specs/d2o.md 4.2.2, 2.3, 2.4): an evicted entry whose nearest kept
// key (cosine) is similar enough is merged into that kept entry instead of being dropped. Similar enough: at or
// above an EMA threshold tau of the layer, reset for every request. Pure functions; the similarities come from
// the backend (LayerKeys), the merges go back to it (KvMerges).
#include <cstdint>
#include <optional>
#include <span>

#include "kernels/kv_merge.h"

namespace strata {

// The threshold of one (sequence, layer). The policy object lives for one request, so tau starts unset for each
// (the official code leaks it across requests, spec 2.5).
class D2oThreshold {
 public:
  // tau <- a * tau + b * mean (the official code's alpha and belta, 0.5 and 0.5; the paper's beta is b with
  // a = 1 - b).
  D2oThreshold(double a, double b) : a_(a), b_(b) {}
  // Takes the mean similarity of this eviction's entries (mean over its evicted entries and all heads) and
  // returns the updated tau: the mean itself the first time (the paper's tau_0 and the code's unset case), the
  // EMA afterwards. Updated before the comparison, as in the code.
  double update(double mean_similarity) {
    value_ = value_ ? a_ * *value_ + b_ * mean_similarity : mean_similarity;
    return *value_;
  }
  std::optional<double> value() const { return value_; }

 private:
  double a_;
  double b_;
  std::optional<double> value_;
};

enum class D2oMergeWeight {
  // The official code (scatter_reduce "mean" with include_self): k_t <- (k_t + sum_e u_e k_e) / (1 + n_t). The
  // weights do not sum to 1 (spec 2.3).
  code_mean,
  // The paper (Eq. 10-11, per-token reading of spec 1): a softmax over the similarities where the kept entry
  // counts with similarity 1: k_t <- (e k_t + sum_e e^{u_e} k_e) / (e + sum_e e^{u_e}).
  paper_softmax,
};

// One evicted entry of one KV head chosen for merging: into `target` (a kept entry), with its similarity.
struct D2oMergeCandidate {
  int32_t evicted = 0;
  int32_t target = 0;
  float similarity = 0.0f;
};

// The merges of one KV head: every target with all its evicted entries, weighted by `rule`. Targets ascending;
// the sources of a target in the order given.
KvMerges d2o_merges(std::span<const D2oMergeCandidate> chosen, D2oMergeWeight rule);

}  // namespace strata
