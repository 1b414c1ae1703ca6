#pragma once
// The primitives the score-based policies share (spec pyramidkv.md sections 2, 3.4 and 5): reducing query-head
// scores to KV heads, 1-D pooling along the key axis, a deterministic top-k, the observation-window selection
// built from them, and PyramidKV's per-layer budgets. Pure functions: no state, no I/O.
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "cache/compression_policy.h"

namespace strata {

// How the G query heads of a GQA group combine into their KV head's score (spec section 5: mean and sum rank
// alike, max is the other real option).
enum class HeadReduction { mean, max };

// Pooling along the key axis (spec section 2, step 5). `none` leaves the scores as they are (H2O).
enum class Pooling { none, max, avg };

// Column sums [n_heads][stride] (the first n_cols of each row) reduced to [n_kv_heads][n_cols]: query head h
// belongs to KV head h / (n_heads / n_kv_heads). Applied after the sum over query rows and before pooling (spec
// section 5), because the daemon stores one cache per KV head. Throws std::invalid_argument unless n_kv_heads
// divides n_heads.
std::vector<std::vector<float>> reduce_to_kv_heads(const float* sums, int stride, int n_heads, int n_kv_heads,
                                                   int n_cols, HeadReduction reduction);

// 1-D pooling with stride 1 and padding kernel/2, so the output has the input's length (spec section 2, step 5).
// max: padded cells never win. avg: zero padding and every cell divided by `kernel`, edges included (PyTorch's
// count_include_pad). `kernel` must be odd and >= 1 (std::invalid_argument otherwise); kernel 1 is the identity.
std::vector<float> pool1d(std::span<const float> scores, int kernel, Pooling pooling);

// The indices of the k highest scores, returned ascending. Ties go to the lower index: the order is "higher score
// first, then lower index" (spec section 1.6 leaves the rule open; this one is deterministic and stable under
// max-pool plateaus). NaN ranks below every number, so a bad score can never crowd out a real one.
// Requires 0 <= k <= scores.size().
std::vector<int32_t> top_k(std::span<const float> scores, int k);

// A query-agnostic policy's entries right after the chunked compression at `point` of a prefill from position 0
// (CompressionPolicy::entries_after_point): each compression point p, a multiple of chunk, keeps
// min(held + chunk, budget_at(p)) of the previous point's entries and a chunk. nullopt unless point is a positive
// multiple of chunk.
std::optional<int> entries_after_chunked_points(int point, int chunk, const std::function<int(int)>& budget_at);

// How a layer scores its prompt keys from the observation-window column sums.
struct WindowScoring {
  HeadReduction reduction = HeadReduction::mean;
  Pooling pooling = Pooling::none;
  int kernel = 1;
};

// SnapKV's selection (spec section 2, steps 4-6, at KV-head granularity): for each KV head, scores over the
// non-window keys [0, n - window) from state's column sums, reduced over the GQA group, pooled, and the
// top-`keep` of them, followed by the window [n - window, n), where n = state.n_entries. One ascending list per KV
// head, all of length keep + window. Requires window <= n and keep <= n - window.
Selection select_top_plus_window(const LayerState& state, int n_heads, int n_kv_heads, int window, int keep,
                                 const WindowScoring& scoring);

// PyramidKV's non-window budget k_l for every layer l in [0, n_layers), for a prompt of prompt_len tokens, average
// capacity C per layer (window included), window w and shape beta. nullopt when prompt_len < C: nothing is
// compressed (spec section 3.4, first gate). Every k_l lies in [0, prompt_len - w]. Requires C > w >= 0,
// n_layers >= 1, beta >= 1.
//
// official: the reference code's integer schedule, spec section 3.4 exactly: a = C - w; n < 2a gives a uniform a;
// else lo = floor(a / beta), hi = 2a - lo, clamped to hi = n - w, lo = 2a - hi when hi >= n - w;
// k_l = hi - l * floor((hi - lo) / (L - 1)); L == 1 gives a. Its total exceeds L * a (the table in 3.4).
std::optional<std::vector<int>> pyramid_budgets_official(int n_layers, int prompt_len, int capacity, int window,
                                                         int beta);

// exact: the paper's real-valued schedule (top a / beta, bottom 2a - a / beta, linear in between), whose total is
// exactly L * a, rounded so that the integer total is L * a too. The one clamp kept from the code: when the bottom
// layer would exceed the n - w keys there are, hi = n - w and lo = 2a - hi, which keeps the real total at L * a
// (and is uniform a at n == C, so no separate n < 2a gate is needed; that gate is a code artefact, spec 6.2).
// Rounding rule: every k_l is computed exactly as a fraction of 64-bit integers, floored, and the missing units
// (fewer than L) go one each to the layers with the largest fractional parts, the lower layer first among equal
// parts. The result is therefore the same on every rank and never increases with l, like the real schedule.
std::optional<std::vector<int>> pyramid_budgets_exact(int n_layers, int prompt_len, int capacity, int window,
                                                      int beta);

}  // namespace strata
