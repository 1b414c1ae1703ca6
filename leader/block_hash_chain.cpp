#include "leader/block_hash_chain.h"

namespace strata {
namespace {

// splitmix64's finaliser: every input bit reaches every output bit.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

void extend_block_hash_chain(std::vector<uint64_t>& chain, std::span<const int32_t> tokens, int block_size,
                             uint64_t salt) {
  const size_t block = size_t(block_size);
  uint64_t h = chain.empty() ? mix(salt) : chain.back();
  for (size_t end = (chain.size() + 1) * block; end <= tokens.size(); end += block) {
    for (size_t i = end - block; i < end; ++i) h = mix(h ^ uint64_t(uint32_t(tokens[i])));
    chain.push_back(h);
  }
}

std::vector<uint64_t> block_hash_chain(std::span<const int32_t> tokens, int block_size, uint64_t salt) {
  std::vector<uint64_t> chain;
  extend_block_hash_chain(chain, tokens, block_size, salt);
  return chain;
}

std::vector<uint64_t> compressed_block_chain(uint64_t prefix_hash, std::string_view policy, int n_blocks) {
  uint64_t h = mix(prefix_hash ^ 0x636f6d7072657373ULL);  // "compress": never a token block's hash chain
  for (char c : policy) h = mix(h ^ uint64_t(uint8_t(c)));
  std::vector<uint64_t> chain;
  for (int i = 0; i < n_blocks; ++i) chain.push_back(h = mix(h ^ uint64_t(i)));
  return chain;
}

}  // namespace strata
