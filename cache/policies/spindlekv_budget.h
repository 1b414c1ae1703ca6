#pragma once
// SpindleKV's per-layer eviction budget (../shared/specs/spindlekv.md section 2, Eq. 5-6): PyramidKV-style linear
// interpolation of the context keep-ratio from the bottom layer to the top, with the spec's corrected formula.
// A pure function of the global layer index, the model's layer count and the prompt length (design rule 1).
#include <optional>

namespace strata {

struct SpindleBudget {
  double ratio = 0.4;   // r: the target share of the prompt kept per layer on average, window included
  int window = 8;       // l_w: the last prompt tokens, always kept
  double beta = 0.05;   // the smallest per-layer context keep-ratio
  // The top layer's ratio in the upper regime (alpha < r_c <= 1): 2 r_c - 1 (the spec's correction, the mean stays
  // r_c) or the paper's printed 1 - 2 r_c, clamped at 0 (a mode for comparison; its mean is not r_c).
  bool printed_top = false;
};

// k: the context tokens (among the first l - l_w) that layer `layer` of n_layers keeps per KV head for a prompt of
// prompt_len tokens, or nullopt when it keeps the whole prompt (l <= l_w, r_c >= 1, or k = l - l_w).
//   l_c = l - l_w,  r_c = (r l - l_w) / l_c,  alpha = (1 + beta) / 2
//   r_c <= 0: 0 (the window only);  r_c <= beta: beta in every layer (spec's recommendation);
//   beta < r_c <= alpha: from 2 r_c - beta (layer 0) down to beta (layer m - 1);
//   alpha < r_c < 1: from 1 down to 2 r_c - 1;   r_c(layer) linear in between;   k = floor(r_c(layer) * l_c).
// A model of one layer keeps the mean of the two ends (r_c, or beta when r_c <= beta).
std::optional<int> spindle_context_keep(int layer, int n_layers, int prompt_len, const SpindleBudget& budget);

}  // namespace strata
