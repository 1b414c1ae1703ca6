#pragma once
// The hash chain that names prompt blocks: block i's hash mixes block i-1's hash (the salt's, for the first) with
// block i's tokens, so one hash stands for the whole prefix up to the end of its block. The prefix cache
// (leader/prefix_index.h) names its blocks with it, and the router (router/) its index of what each replica holds.
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace strata {

// Appends to `chain` (the hashes of the leading full blocks of `tokens`) those of the full blocks after them.
void extend_block_hash_chain(std::vector<uint64_t>& chain, std::span<const int32_t> tokens, int block_size,
                             uint64_t salt);

// The hashes of the full blocks of `tokens`, in order.
std::vector<uint64_t> block_hash_chain(std::span<const int32_t> tokens, int block_size, uint64_t salt);

// The hashes of the n_blocks blocks of a compressed prefix: the entries a query-agnostic policy (described by
// `policy`, its canonical text) keeps of the prefix whose chain ends in prefix_hash (leader/prefix_cache.h).
std::vector<uint64_t> compressed_block_chain(uint64_t prefix_hash, std::string_view policy, int n_blocks);

}  // namespace strata
