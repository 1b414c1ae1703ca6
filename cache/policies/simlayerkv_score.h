#pragma once
// SimLayerKV's lazy-layer score (specs/simlayerkv.md 2.2, 2.3): the attention mass a layer's query heads put on
// S = [0, n_init) ∪ [n - window, n), averaged over the query rows summed and over ALL query heads of the layer.
//
// The score is split in two steps so that tensor parallelism needs one scalar reduction and nothing else (spec 8,
// design rule 3): each rank computes its part from its own query heads (simlayerkv_score_part), the parts of all
// ranks of a stage are summed field by field (one all-reduce of two numbers per (sequence, layer)), and the total
// gives the score (simlayerkv_score). Averaging the per-rank means instead would weigh ranks, not heads, and is not
// what the method measures (spec 2.5).
#include <algorithm>

#include "cache/compression_policy.h"

namespace strata {

// One rank's share of the score. Both fields add across ranks.
struct SimLayerKvScorePart {
  double mass = 0.0;  // sum over this rank's query heads of the head's mass on S, averaged over the rows summed
  int heads = 0;      // query heads counted in `mass`
};

// The part from this rank's n_heads query heads. state.column_sums holds, per head, the sum over n_rows query rows
// of each row's softmax probabilities; n = state.n_entries. S is a union of two disjoint ranges, so an entry in
// both the initial and the recent set is counted once (spec D6: the official code counts it twice when
// n < n_init + window and can then score above 1). Accumulates in double: thresholds near 0.9 are sensitive to
// rounding (spec 7, numerics).
inline SimLayerKvScorePart simlayerkv_score_part(const LayerState& state, int n_heads, int n_rows, int n_init,
                                                 int window) {
  const int n = state.n_entries;
  const int initial_end = std::min(n_init, n);
  const int recent_begin = std::max(initial_end, n - window);
  SimLayerKvScorePart part;
  for (int h = 0; h < n_heads; ++h) {
    double head_mass = 0.0;
    for (int e = 0; e < initial_end; ++e) head_mass += state.sum(h, e);
    for (int e = recent_begin; e < n; ++e) head_mass += state.sum(h, e);
    part.mass += head_mass / n_rows;
  }
  part.heads = n_heads;
  return part;
}

// The layer's score from the parts of all its query heads (after the all-reduce under tensor parallelism).
inline double simlayerkv_score(const SimLayerKvScorePart& total) { return total.mass / total.heads; }

}  // namespace strata
