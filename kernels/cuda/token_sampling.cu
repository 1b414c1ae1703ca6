// Token sampling on the device (Backend::sample_rows): the rule of kernels/token_sampling.h applied where the
// logits are, so that only the chosen tokens and their logprobs cross to the host. The CPU's sample_row_on_host
// (kernels/cpu/token_sampling.cpp) is the reference. A seeded request must draw the same tokens on both backends and
// on every run, so every choice here is exact (integer counts, comparisons of keys) and every sum of weights is
// taken in double in a fixed order: per thread in index order, then the warp's lanes in a fixed shuffle tree, then
// the warps in order. Against the CPU's single running sum only the rounding of those sums differs (~1e-16
// relative), with expf's last bits: that matters only when the uniform number falls on the boundary between two
// tokens.
//
// Block (row) of kThreads threads handles one row, which stays where it is: it is never sorted or copied (128K
// logits do not fit in shared memory), only read in passes.
//  - The mask (rule step 0), when the row has one: one pass writes -inf over the tokens it does not allow. Their
//    keys then come last in the order and their weights are 0, so nothing below needs to know of them, except
//    that the top n logprobs may not reach into them: the host caps n at the number of allowed tokens.
//  - Order keys. The rule's order (larger logit first, lower id among equal logits) is the order of a 64-bit key,
//    (order-preserving bits of the logit) << b | (V - 1 - id), b the bits of V - 1, the larger first; -0 and +0
//    get one key. Every prefix of the order is then the set {key >= C} for a threshold C: each filter of the rule
//    is one number, and testing a token against it needs only the token's own logit.
//  - top_k and top_p by bisection on C. top_k's threshold is the largest C whose set holds top_k tokens; top_p's the
//    largest C, at or above that, whose set holds top_p of the top_k set's weight. A bisection step counts (and,
//    for top_p, weighs) the set of its midpoint in one pass over the row, and the search stops as soon as the
//    sets of lo and hi differ by one token, so a step roughly halves the undecided tokens rather than one bit of
//    key: 16 to 25 passes at V = 128K for logits spread like a model's, 32 + b at worst (equal logits across the
//    boundary, told apart by their ids).
//  - min_p keeps the weights w >= min_p: a prefix too (w grows with the logit), tested wherever a kept weight is
//    read. A kept token of weight 0 behaves as an unkept one (it adds nothing and is never drawn), so "the kept
//    weight" of a token is its weight or 0.
//  - The draw. Each thread owns a contiguous range of ids and sums its kept weights; an exclusive scan over the
//    threads gives each range's start, and each thread walks its range from there in id order for the first kept
//    token whose running sum exceeds uniform * total. The lowest such id over the block is the token: the one where
//    the running sum first crosses, whatever the scan's rounding at the ranges' seams. When rounding leaves every
//    running sum at or below the target, the last kept token with a weight, as on the CPU.
//  - Logprobs (n_logprobs >= 0): the log-sum-exp at temperature 1 in one pass; the top n by the same counting
//    bisection as top_k, then those n tokens gathered in shared memory and put in order by one thread.
//
// Cost per row, in passes over its V logits (each reads 4V bytes, from L2 after the first): a greedy row 1, as an
// argmax; a draw 3 (key range, kept sums, the walk) plus a bisection for top_k (counts only) and one for top_p
// (an expf per token); logprobs 1 (log-sum-exp) plus, for a top n, a bisection and the gathering pass; a mask 1
// (V / 8 bytes of mask read, a write per masked token).
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/token_mask_layout.h"

namespace strata::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kAllLanes = 0xffffffffu;
// The most logprobs a row may ask for (the router's limit); the result buffer holds this many per row.
constexpr int kMaxLogprobs = 20;
// Column indices and the threads' shares of a row stay far from int overflow.
constexpr int64_t kMaxColumns = int64_t(1) << 30;

// One row's RowSampling as the kernel reads it; its penalties are penalties[penalty_begin, + penalty_count), its
// mask masks[mask_begin, + ceil(V / 64)) (mask_begin < 0: none). n_logprobs is capped at the allowed tokens.
struct RowParams {
  double uniform;
  float temperature, top_p, min_p;
  int32_t top_k, n_logprobs, penalty_begin, penalty_count, mask_begin;
};

// What the kernel writes for one row: the token and, when asked, its logprob and the most likely tokens.
struct RowResult {
  int32_t id;
  float logprob;
  int32_t top_ids[kMaxLogprobs];
  float top_logprobs[kMaxLogprobs];
};

void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("cuda backend: " + what);
}

__device__ inline int lane() { return int(threadIdx.x) % 32; }
__device__ inline int warp() { return int(threadIdx.x) / 32; }

// The row as the block sees it, after the penalties.
struct Row {
  float* x;
  int n;                  // V
  int id_bits;            // the bits of V - 1: the low part of a key
  float max;              // the largest logit
  float inv_temperature;  // 1 / temperature, rounded as the CPU rounds it

  // The rule's order as a number, the larger first. The high part is the logit's bits made order-preserving as an
  // unsigned number (negative floats flipped, the others lifted above them), reading -0 as +0 (they are equal
  // logits); the low part, V - 1 - id, puts the lower id first among equal logits. Keeping the low part as narrow
  // as V lets a bisection among equal logits take log2(V) steps rather than 32.
  __device__ uint64_t key(float logit, int id) const {
    uint32_t bits = __float_as_uint(logit);
    if (bits == 0x80000000u) bits = 0;
    bits = (bits & 0x80000000u) ? ~bits : bits | 0x80000000u;
    return (uint64_t(bits) << id_bits) | uint64_t(n - 1 - id);
  }
  __device__ int id_of(uint64_t key) const { return n - 1 - int(key & ((uint64_t(1) << id_bits) - 1)); }
  // exp((x - max) / T) as the CPU computes it: 1 for the largest logit.
  __device__ float weight(float logit) const { return expf((logit - max) * inv_temperature); }
};

// The tokens of one set {key >= C}: how many, and (when weighed) their total weight.
struct Tally {
  int count;
  double mass;
};
// The smallest and largest key of the row: the last and the first token of the order.
struct KeyRange {
  uint64_t lowest, highest;
};

template <class T>
__device__ T shuffle_xor(T v, int offset) {
  return __shfl_xor_sync(kAllLanes, v, offset);
}
__device__ Tally shuffle_xor(Tally t, int offset) {
  return {shuffle_xor(t.count, offset), shuffle_xor(t.mass, offset)};
}
__device__ KeyRange shuffle_xor(KeyRange r, int offset) {
  return {shuffle_xor(r.lowest, offset), shuffle_xor(r.highest, offset)};
}

// combine() over the block's values, in a fixed order: each warp's shuffle tree (lane 0's result), then the warps
// in order. Every thread returns the same total. Call from uniform control flow only (it synchronises the block).
template <class T, class Combine>
__device__ T block_reduce(T v, Combine combine) {
  __shared__ T warp_values[kWarps];
  for (int offset = 16; offset > 0; offset /= 2) v = combine(v, shuffle_xor(v, offset));
  if (lane() == 0) warp_values[warp()] = v;
  __syncthreads();
  T total = warp_values[0];
  for (int w = 1; w < kWarps; ++w) total = combine(total, warp_values[w]);
  __syncthreads();  // warp_values is free for the next call
  return total;
}

// The sum of `v` over the threads before this one, and over all of them (`total`), in a fixed order: a shuffle scan
// within each warp, then the warps' totals in order.
__device__ double exclusive_scan(double v, double& total) {
  __shared__ double warp_totals[kWarps];
  double inclusive = v;
  for (int d = 1; d < 32; d *= 2) {
    const double below = __shfl_up_sync(kAllLanes, inclusive, d);
    if (lane() >= d) inclusive += below;
  }
  const double before_lane = __shfl_up_sync(kAllLanes, inclusive, 1);
  if (lane() == 31) warp_totals[warp()] = inclusive;
  __syncthreads();
  double before_warp = 0.0;
  total = 0.0;
  for (int w = 0; w < kWarps; ++w) {
    if (w == warp()) before_warp = total;
    total += warp_totals[w];
  }
  __syncthreads();
  return lane() == 0 ? before_warp : before_warp + before_lane;
}

__device__ KeyRange key_range(const Row& row) {
  KeyRange r{~uint64_t(0), 0};
  for (int i = int(threadIdx.x); i < row.n; i += kThreads) {
    const uint64_t key = row.key(row.x[i], i);
    r.lowest = min(r.lowest, key);
    r.highest = max(r.highest, key);
  }
  return block_reduce(r, [](KeyRange a, KeyRange b) {
    return KeyRange{min(a.lowest, b.lowest), max(a.highest, b.highest)};
  });
}

// The set {key >= threshold}: one pass over the row. Its mass is a function of the set alone (the same elements
// summed in the same order), so a bisection sees the same mass for the same set, and a larger set never weighs less.
__device__ Tally tally(const Row& row, uint64_t threshold, bool weighed) {
  Tally t{0, 0.0};
#pragma unroll 4
  for (int i = int(threadIdx.x); i < row.n; i += kThreads) {
    const float x = row.x[i];
    if (row.key(x, i) >= threshold) {
      t.count += 1;
      if (weighed) t.mass += row.weight(x);
    }
  }
  return block_reduce(t, [](Tally a, Tally b) { return Tally{a.count + b.count, a.mass + b.mass}; });
}

// The shortest prefix of the order that is enough(), as its threshold: the largest C in [lo, hi) whose set is
// enough, given that lo's set is (count_lo tokens) and hi's is not (count_hi tokens). Once the two sets differ by
// one token, every threshold between lo and hi gives one of them, so lo's set is the answer.
template <class Enough>
__device__ uint64_t shortest_prefix(const Row& row, bool weighed, Enough enough, uint64_t lo, int count_lo,
                                    uint64_t hi, int count_hi) {
  while (count_lo - count_hi > 1) {  // then [lo, hi) holds two keys, so lo < mid < hi
    const uint64_t mid = lo + (hi - lo) / 2;
    const Tally t = tally(row, mid, weighed);
    if (enough(t)) {
      lo = mid;
      count_lo = t.count;
    } else {
      hi = mid;
      count_hi = t.count;
    }
  }
  return lo;
}

// The threshold of the first k tokens of the order, 1 <= k; all of them when k >= V.
__device__ uint64_t first_k(const Row& row, const KeyRange& keys, int k) {
  if (k >= row.n) return keys.lowest;
  if (k == 1) return keys.highest;
  // The lowest key's set is the whole row (n >= k tokens), the highest key's the first token alone (1 < k).
  return shortest_prefix(row, false, [k](const Tally& t) { return t.count >= k; }, keys.lowest, row.n, keys.highest,
                         1);
}

// The threshold of the shortest prefix of the set {key >= cut} (at_cut: its tally) whose weights reach `target`.
__device__ uint64_t nucleus(const Row& row, const KeyRange& keys, uint64_t cut, const Tally& at_cut, double target) {
  // The first token alone weighs exp(0) = 1: enough for a small top_p or a peaked row, with no pass at all.
  if (1.0 >= target) return keys.highest;
  // cut's set weighs at_cut.mass >= top_p * at_cut.mass = target; the first token's (1) does not reach it.
  return shortest_prefix(row, true, [target](const Tally& t) { return t.mass >= target; }, cut, at_cut.count,
                         keys.highest, 1);
}

// The drawn token of a row with temperature > 0 (rule step 3).
__device__ int draw(const Row& row, const KeyRange& keys, const RowParams& p) {
  uint64_t cut = keys.lowest;  // the kept tokens: key >= cut, and weight >= floor
  if (p.top_k > 0 && p.top_k < row.n) cut = first_k(row, keys, p.top_k);
  if (p.top_p < 1.0f) {
    const Tally top_k_set = tally(row, cut, true);
    cut = nucleus(row, keys, cut, top_k_set, double(p.top_p) * top_k_set.mass);
  }
  const float floor = p.min_p > 0.0f ? fminf(p.min_p, 1.0f) : 0.0f;  // the first token (weight 1) always stays
  const auto kept_weight = [&](int i) {
    const float x = row.x[i];
    if (row.key(x, i) < cut) return 0.0f;
    const float w = row.weight(x);
    return w >= floor ? w : 0.0f;
  };

  const int chunk = (row.n + kThreads - 1) / kThreads;
  const int begin = min(row.n, int(threadIdx.x) * chunk), end = min(row.n, begin + chunk);
  double own = 0.0;
  int last = -1;  // this range's last token with a kept weight
  for (int i = begin; i < end; ++i) {
    const float w = kept_weight(i);
    if (w > 0.0f) {
      own += w;
      last = i;
    }
  }
  double total;
  double running = exclusive_scan(own, total);
  const double target = p.uniform * total;
  int crossing = INT_MAX;
  for (int i = begin; i < end; ++i) {
    const float w = kept_weight(i);
    if (w > 0.0f) {
      running += w;
      if (running > target) {
        crossing = i;
        break;
      }
    }
  }
  crossing = block_reduce(crossing, [](int a, int b) { return min(a, b); });
  if (crossing != INT_MAX) return crossing;
  last = block_reduce(last, [](int a, int b) { return max(a, b); });
  return last >= 0 ? last : row.id_of(keys.highest);  // no weight at all (NaN logits): the first token
}

// Rule step 4: log_softmax at temperature 1 for the chosen token and the first n_top tokens of the order.
__device__ void write_logprobs(const Row& row, const KeyRange& keys, int chosen, int n_top, RowResult& out) {
  double sum = 0.0;
  for (int i = int(threadIdx.x); i < row.n; i += kThreads) sum += expf(row.x[i] - row.max);
  sum = block_reduce(sum, [](double a, double b) { return a + b; });
  const double log_sum = log(sum);
  const auto logprob = [&](int id) { return float(double(row.x[id]) - double(row.max) - log_sum); };
  if (threadIdx.x == 0) out.logprob = logprob(chosen);
  if (n_top == 0) return;

  // The first n_top tokens are exactly the set of their threshold: gather them, then order them by key.
  __shared__ uint64_t top_keys[kMaxLogprobs];
  __shared__ int n_found;
  const uint64_t cut = first_k(row, keys, n_top);
  if (threadIdx.x == 0) n_found = 0;
  __syncthreads();
  for (int i = int(threadIdx.x); i < row.n; i += kThreads) {
    const uint64_t key = row.key(row.x[i], i);
    if (key >= cut) {
      const int slot = atomicAdd(&n_found, 1);
      if (slot < kMaxLogprobs) top_keys[slot] = key;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int j = 1; j < n_top; ++j) {  // insertion sort, larger keys first
      const uint64_t key = top_keys[j];
      int k = j;
      for (; k > 0 && top_keys[k - 1] < key; --k) top_keys[k] = top_keys[k - 1];
      top_keys[k] = key;
    }
    for (int j = 0; j < n_top; ++j) {
      const int id = row.id_of(top_keys[j]);
      out.top_ids[j] = id;
      out.top_logprobs[j] = logprob(id);
    }
  }
}

// Block (r) applies row r's mask and penalties to logits[r, :] in place, then chooses its token and writes
// results[r].
__global__ void __launch_bounds__(kThreads)
    sample_rows_kernel(float* logits, int n, const RowParams* params, const TokenPenalty* penalties,
                       const uint64_t* masks, RowResult* results) {
  const RowParams p = params[blockIdx.x];
  float* x = logits + int64_t(blockIdx.x) * n;
  if (p.mask_begin >= 0) {
    const uint64_t* allowed = masks + p.mask_begin;
    for (int i = int(threadIdx.x); i < n; i += kThreads) {
      if ((allowed[mask_word(i)] & mask_bit(i)) == 0) x[i] = -INFINITY;
    }
    __syncthreads();  // a penalty may fall on a masked token: -inf stays -inf, in either order, but not at once
  }
  // Distinct ids (the rule's): one thread each.
  for (int i = int(threadIdx.x); i < p.penalty_count; i += kThreads) {
    const TokenPenalty& penalty = penalties[p.penalty_begin + i];
    x[penalty.id] -= penalty.amount;
  }
  __syncthreads();

  Row row{x, n, n > 1 ? 32 - __clz(n - 1) : 0, 0.0f, __frcp_rn(p.temperature)};
  const KeyRange keys = key_range(row);
  const int first = row.id_of(keys.highest);
  row.max = x[first];
  const int chosen = p.temperature <= 0.0f ? first : draw(row, keys, p);
  RowResult& out = results[blockIdx.x];
  if (p.n_logprobs >= 0) write_logprobs(row, keys, chosen, min(p.n_logprobs, n), out);
  if (threadIdx.x == 0) out.id = chosen;
}

}  // namespace

void sample_rows(CudaContext& ctx, Tensor& logits, std::span<const RowSampling> rows, std::span<RowSample> out) {
  require(logits.dtype == DType::f32, "sample_rows: logits must be f32");
  require(logits.rows == int64_t(rows.size()) && out.size() == rows.size() && logits.cols >= 1 &&
              logits.cols <= kMaxColumns,
          "sample_rows: logits [" + std::to_string(logits.rows) + ", " + std::to_string(logits.cols) + "] for " +
              std::to_string(rows.size()) + " samplings and " + std::to_string(out.size()) +
              " outputs (one of each per row; 1 to 2^30 columns)");
  const int n = int(logits.cols);
  std::vector<RowParams> params;
  std::vector<TokenPenalty> penalties;
  std::vector<uint64_t> masks;  // the rows' masks that are not empty, one after the other
  params.reserve(rows.size());
  for (size_t r = 0; r < rows.size(); ++r) {
    const RowSampling& s = rows[r];
    require(s.n_logprobs <= kMaxLogprobs, "sample_rows: row " + std::to_string(r) + " asks for " +
                                              std::to_string(s.n_logprobs) + " logprobs, more than " +
                                              std::to_string(kMaxLogprobs));
    check_penalties(s.penalties, n);  // distinct ids: the kernel subtracts them in parallel, without atomics
    const int64_t n_allowed = check_mask(s.allowed, n, int64_t(r));
    require(masks.size() + s.allowed.size() <= size_t(INT32_MAX), "sample_rows: the masks exceed 2^31 words");
    const int32_t mask_begin = s.allowed.empty() ? -1 : int32_t(masks.size());
    params.push_back(RowParams{s.uniform, s.temperature, s.top_p, s.min_p, s.top_k,
                               int32_t(std::min<int64_t>(s.n_logprobs, n_allowed)), int32_t(penalties.size()),
                               int32_t(s.penalties.size()), mask_begin});
    penalties.insert(penalties.end(), s.penalties.begin(), s.penalties.end());
    masks.insert(masks.end(), s.allowed.begin(), s.allowed.end());
  }
  if (rows.empty()) return;

  auto* results = static_cast<RowResult*>(ctx.scratch(rows.size() * sizeof(RowResult)));
  sample_rows_kernel<<<unsigned(rows.size()), kThreads, 0, ctx.stream()>>>(
      logits.f32(), n, ctx.upload_structs<int64_t>(params), ctx.upload_structs<int32_t>(penalties),
      ctx.upload_structs<int64_t>(masks), results);
  check(cudaGetLastError(), "sample_rows_kernel");
  std::vector<RowResult> host(rows.size());
  ctx.download(results, host.data(), host.size() * sizeof(RowResult));

  for (size_t r = 0; r < rows.size(); ++r) {
    RowSample& sample = out[r];
    sample = RowSample{};
    sample.id = host[r].id;
    if (rows[r].n_logprobs < 0) continue;
    sample.logprob = host[r].logprob;
    const int n_top = std::min(params[r].n_logprobs, n);
    for (int j = 0; j < n_top; ++j) sample.top.push_back({host[r].top_ids[j], host[r].top_logprobs[j]});
  }
}

}  // namespace strata::cuda
