#pragma once
// How the kernels' loops over quantized weights ask for them ahead of the block they read (docs/decisions.md,
// [cpu-xeon]): the integer kernels' 16-row tiles (AVX-512 VNNI, AVX2, and the AMX kernel's making of blocks), the
// fp32 kernels' lone row (AVX-512, AVX2: decode of one sequence with engine.activation_dtype f32), and the integer
// kernels' pairs, which always ask near:
//   near  prefill chunks (more than 8 rows of x), bound by their products: one line a block kNearPrefetchBytes ahead
//         into L1 (never asking made prefill 0.88-0.90x as fast: bench/results/cpu-*tiles-*-before-after.json);
//   far   decode on Intel CPUs, bound by the weights' stream, where a core left to its hardware prefetchers keeps
//         too few lines in flight: every line of a block kFarPrefetchBytes ahead into L2 (on a Xeon, SmolLM2's
//         batch-1 decode 1.56x as fast with the VNNI kernel, the Q4_K_M file's 1.25x with the AVX2 one);
//   none  the tiles' decode elsewhere: on the AMD EPYC, whose prefetchers keep up, asking near slowed batch-1
//         decode (without, 1.10-1.22x as fast). The fp32 lone row asks near there, as it always had (a layer's
//         matrices were too small for the prefetchers to reach full speed on their own). Asking far is not
//         measured on an AMD core yet.
#include <cstdint>

namespace strata::cpu {

enum class WeightPrefetch : uint8_t { none, near, far };
constexpr int64_t kNearPrefetchBytes = 1024;
constexpr int64_t kFarPrefetchBytes = 8192;

// How a decode loop asks on this machine: far on an Intel CPU, else `elsewhere`.
WeightPrefetch decode_prefetch(WeightPrefetch elsewhere);
// How a tile loop over `rows_of_x` rows of x asks.
inline WeightPrefetch tile_prefetch(int64_t rows_of_x) {
  return rows_of_x > 8 ? WeightPrefetch::near : decode_prefetch(WeightPrefetch::none);
}

// The asking for a block of `Bytes` bytes at p; far, it runs past the end of a chunk (into the next one, most often
// the same thread's) and of a matrix, which costs nothing where nothing is mapped: a prefetch never faults. Inlined
// always: GCC 12 takes a function that only prefetches for one without effects and drops its calls that it has not
// inlined yet (the far asking once vanished so).
template <int64_t Bytes>
[[gnu::always_inline]] inline void prefetch_ahead(const uint8_t* p, WeightPrefetch how) {
  if (how == WeightPrefetch::near) {
    __builtin_prefetch(p + kNearPrefetchBytes, 0, 3);  // prefetcht0
  } else if (how == WeightPrefetch::far) {
    for (int64_t at = 0; at < Bytes; at += 64) __builtin_prefetch(p + kFarPrefetchBytes + at, 0, 2);  // prefetcht1
  }
}

}  // namespace strata::cpu
