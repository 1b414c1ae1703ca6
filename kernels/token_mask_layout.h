#pragma once
// The one layout of a token mask, a set of token ids over a vocabulary of V tokens: mask_words(V) 64-bit words,
// token id in the set when bit id % 64 of word id / 64 is set; the bits past the last token are unused. The
// grammar builds masks (grammar/token_mask.h), the leader narrows them (min_tokens), the step message codes them
// (parallel/step_plan.cpp) and every backend's sampler reads them (kernels/token_sampling.h): all through this.
#include <cstdint>
#include <cstddef>
#include <span>

// The CUDA sampler reads a mask inside its kernel, so where and which bit must be callable on the device.
#ifdef __CUDACC__
#define STRATA_HOST_DEVICE __host__ __device__
#else
#define STRATA_HOST_DEVICE
#endif

namespace strata {

// The words of a mask over n_tokens tokens.
constexpr int64_t mask_words(int64_t n_tokens) { return (n_tokens + 63) / 64; }
// The word that holds token id, and its bit there.
STRATA_HOST_DEVICE constexpr size_t mask_word(int64_t id) { return size_t(id / 64); }
STRATA_HOST_DEVICE constexpr uint64_t mask_bit(int64_t id) { return uint64_t{1} << (id % 64); }

constexpr bool mask_has(std::span<const uint64_t> mask, int64_t id) { return (mask[mask_word(id)] & mask_bit(id)) != 0; }
constexpr void mask_set(std::span<uint64_t> mask, int64_t id) { mask[mask_word(id)] |= mask_bit(id); }
constexpr void mask_clear(std::span<uint64_t> mask, int64_t id) { mask[mask_word(id)] &= ~mask_bit(id); }

}  // namespace strata
