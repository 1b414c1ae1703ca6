#include "grammar/token_mask.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>

namespace strata::grammar {

VocabularyTrie::VocabularyTrie(const std::vector<std::string>& token_bytes)
    : vocab_size_(static_cast<int32_t>(token_bytes.size())), tokens_(token_bytes) {
  std::vector<int32_t> order;
  for (int32_t id = 0; id < vocab_size_; ++id) {
    if (!tokens_[id].empty()) order.push_back(id);
  }
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return tokens_[a] < tokens_[b]; });
  // Sorted tokens give the trie in pre-order: each token shares its longest common prefix with the one before.
  byte_ = {0};
  depth_ = {0};
  subtree_end_ = {0};
  std::vector<uint32_t> path{0};  // path[d]: the node at depth d of the current token
  std::vector<std::pair<uint32_t, int32_t>> ends;  // (node, token)
  const std::string* previous = nullptr;
  for (int32_t id : order) {
    const std::string& token = tokens_[id];
    size_t common = 0;
    if (previous) {
      while (common < token.size() && common < previous->size() && token[common] == (*previous)[common]) ++common;
    }
    while (path.size() > common + 1) {
      subtree_end_[path.back()] = static_cast<uint32_t>(byte_.size());
      path.pop_back();
    }
    for (size_t d = common; d < token.size(); ++d) {
      path.push_back(static_cast<uint32_t>(byte_.size()));
      byte_.push_back(static_cast<uint8_t>(token[d]));
      depth_.push_back(static_cast<uint16_t>(std::min<size_t>(d + 1, UINT16_MAX)));
      subtree_end_.push_back(0);
    }
    if (token.size() >= UINT16_MAX) throw std::invalid_argument("vocabulary: a token of 65,535 bytes or more");
    max_depth_ = std::max(max_depth_, token.size());
    ends.emplace_back(path.back(), id);
    previous = &token;
  }
  for (uint32_t node : path) subtree_end_[node] = static_cast<uint32_t>(byte_.size());
  token_begin_.assign(byte_.size() + 1, 0);
  for (auto [node, id] : ends) ++token_begin_[node + 1];
  std::partial_sum(token_begin_.begin(), token_begin_.end(), token_begin_.begin());
  token_ids_.resize(ends.size());
  std::vector<uint32_t> fill(token_begin_.begin(), token_begin_.end() - 1);
  for (auto [node, id] : ends) token_ids_[fill[node]++] = id;
}

TokenMasker::TokenMasker(std::shared_ptr<const VocabularyTrie> vocabulary,
                         std::shared_ptr<GrammarAutomaton> automaton, std::vector<int32_t> end_tokens)
    : vocabulary_(std::move(vocabulary)), automaton_(std::move(automaton)), end_tokens_(std::move(end_tokens)) {
  for (int32_t token : end_tokens_) {
    if (token < 0 || token >= vocabulary_->vocab_size()) throw std::invalid_argument("an end token out of range");
  }
  state_at_depth_.resize(vocabulary_->max_depth_ + 1);
}

bool TokenMasker::is_end_token(int32_t token) const {
  return std::find(end_tokens_.begin(), end_tokens_.end(), token) != end_tokens_.end();
}

const TokenMask& TokenMasker::allowed_tokens(StateId state) {
  auto found = cache_.find(state);
  if (found != cache_.end()) return found->second;
  if (cache_.size() >= kMaxCachedMasks) cache_.clear();
  TokenMask& mask = cache_[state];
  compute(state, mask);
  return mask;
}

// One pre-order pass over the trie: a node's parent is the last node visited one level up, so the state after
// its prefix is state_at_depth_[depth - 1]; a refused byte skips the node's whole subtree.
void TokenMasker::compute(StateId state, TokenMask& mask) {
  const VocabularyTrie& trie = *vocabulary_;
  mask.assign((trie.vocab_size() + 63) / 64, 0);
  state_at_depth_[0] = state;
  const uint32_t nodes = static_cast<uint32_t>(trie.byte_.size());
  for (uint32_t node = 1; node < nodes;) {
    uint16_t depth = trie.depth_[node];
    StateId next = automaton_->step(state_at_depth_[depth - 1], trie.byte_[node]);
    if (next == kDeadState) {
      node = trie.subtree_end_[node];
      continue;
    }
    state_at_depth_[depth] = next;
    for (uint32_t i = trie.token_begin_[node]; i < trie.token_begin_[node + 1]; ++i) {
      int32_t token = trie.token_ids_[i];
      mask[token >> 6] |= uint64_t{1} << (token & 63);
    }
    ++node;
  }
  // End tokens go by completeness alone, whatever bytes the vocabulary gave them.
  bool complete = automaton_->is_complete(state);
  for (int32_t token : end_tokens_) {
    uint64_t bit = uint64_t{1} << (token & 63);
    mask[token >> 6] = complete ? mask[token >> 6] | bit : mask[token >> 6] & ~bit;
  }
}

StateId TokenMasker::advance(StateId state, int32_t token) {
  if (token < 0 || token >= vocabulary_->vocab_size()) return kDeadState;
  if (is_end_token(token)) return automaton_->is_complete(state) ? state : kDeadState;
  const std::string& bytes = vocabulary_->tokens_[token];
  if (bytes.empty()) return kDeadState;
  for (char byte : bytes) {
    state = automaton_->step(state, static_cast<uint8_t>(byte));
    if (state == kDeadState) return kDeadState;
  }
  return state;
}

TokenMatcher::TokenMatcher(std::shared_ptr<const VocabularyTrie> vocabulary, std::shared_ptr<const Grammar> grammar,
                           std::vector<int32_t> end_tokens)
    : masker_(std::move(vocabulary), std::make_shared<GrammarAutomaton>(std::move(grammar)), std::move(end_tokens)),
      state_(masker_.automaton().initial()) {}

bool TokenMatcher::accept_token(int32_t token) {
  if (finished_) return false;
  StateId next = masker_.advance(state_, token);
  if (next == kDeadState) return false;
  if (masker_.is_end_token(token)) finished_ = true;
  state_ = next;
  return true;
}

}  // namespace strata::grammar
