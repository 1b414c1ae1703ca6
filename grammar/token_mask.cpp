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
  longest_below_ = {0};
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
      longest_below_.push_back(0);
    }
    if (token.size() >= UINT16_MAX) throw std::invalid_argument("vocabulary: a token of 65,535 bytes or more");
    max_depth_ = std::max(max_depth_, token.size());
    const auto length = static_cast<uint16_t>(token.size());
    for (uint32_t node : path) longest_below_[node] = std::max(longest_below_[node], length);
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
  index_lengths();
}

void VocabularyTrie::index_lengths() {
  std::vector<std::vector<int32_t>> by_length(max_depth_ + 1);
  for (int32_t id = 0; id < vocab_size_; ++id) by_length[tokens_[id].size()].push_back(id);
  TokenMask within(size_t(mask_words(vocab_size_)), 0);  // empty tokens are never allowed as text: left out
  no_longer_than_ = {within};
  length_class_.assign(max_depth_ + 1, 0);
  for (size_t length = 1; length <= max_depth_; ++length) {
    if (!by_length[length].empty()) {
      for (int32_t id : by_length[length]) mask_set(within, id);
      no_longer_than_.push_back(within);
    }
    length_class_[length] = static_cast<uint32_t>(no_longer_than_.size() - 1);
  }
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
  const StateId exact = exact_key(state);
  auto found = cache_.find(exact);
  if (found != cache_.end()) return found->second;
  if (cache_.size() + 2 > kMaxCachedMasks) cache_.clear();  // room for the exact key's mask and the coarse one's
  const GrammarAutomaton::MaskKey coarse = automaton_->mask_key(exact, 1);
  if (coarse.state == exact) return whole_walk_mask(exact);
  // The coarse key's mask for the tokens within its horizon (shorter than the longest token, or the exact key
  // would be the coarse one); the longer ones from the exact key.
  const TokenMask& coarse_mask = whole_walk_mask(coarse.state);
  const VocabularyTrie& trie = *vocabulary_;
  const TokenMask& within = trie.no_longer_than_[trie.length_class_[coarse.horizon]];
  TokenMask& mask = cache_[exact];
  mask.resize(coarse_mask.size());
  for (size_t word = 0; word < mask.size(); ++word) mask[word] = coarse_mask[word] & within[word];
  walk_longer_than(exact, coarse.horizon, mask);
  set_end_tokens(exact, mask);
  return mask;
}

StateId TokenMasker::exact_key(StateId state) {
  if (static_cast<size_t>(state) >= exact_keys_.size()) exact_keys_.resize(automaton_->state_count(), kDeadState);
  if (exact_keys_[state] == kDeadState) {
    const auto longest = static_cast<uint32_t>(vocabulary_->max_depth_);
    const StateId key = automaton_->mask_key(state, longest).state;  // may add states: assign after
    exact_keys_[state] = key;
  }
  return exact_keys_[state];
}

const TokenMask& TokenMasker::whole_walk_mask(StateId state) {
  auto found = cache_.find(state);
  if (found != cache_.end()) return found->second;
  TokenMask& mask = cache_[state];
  mask.assign(size_t(mask_words(vocabulary_->vocab_size())), 0);
  walk_longer_than(state, 0, mask);
  ++whole_walks_;
  set_end_tokens(state, mask);
  return mask;
}

// One pre-order pass over the trie: a node's parent is the last node visited one level up, so the state after
// its prefix is state_at_depth_[depth - 1]; a refused byte skips the node's whole subtree, and so does a subtree
// without a token longer than `bytes`.
void TokenMasker::walk_longer_than(StateId state, size_t bytes, TokenMask& mask) {
  const VocabularyTrie& trie = *vocabulary_;
  state_at_depth_[0] = state;
  const uint32_t nodes = static_cast<uint32_t>(trie.byte_.size());
  for (uint32_t node = 1; node < nodes;) {
    uint16_t depth = trie.depth_[node];
    StateId next = trie.longest_below_[node] > bytes ? automaton_->step(state_at_depth_[depth - 1], trie.byte_[node])
                                                      : kDeadState;
    if (next == kDeadState) {
      node = trie.subtree_end_[node];
      continue;
    }
    state_at_depth_[depth] = next;
    if (depth > bytes) {  // the tokens that end here are `depth` bytes long
      for (uint32_t i = trie.token_begin_[node]; i < trie.token_begin_[node + 1]; ++i) {
        mask_set(mask, trie.token_ids_[i]);
      }
    }
    ++node;
  }
}

// End tokens go by completeness alone, whatever bytes the vocabulary gave them.
void TokenMasker::set_end_tokens(StateId state, TokenMask& mask) const {
  const bool complete = automaton_->is_complete(state);
  for (int32_t token : end_tokens_) {
    if (complete) {
      mask_set(mask, token);
    } else {
      mask_clear(mask, token);
    }
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
