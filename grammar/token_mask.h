#pragma once
// Which tokens of a vocabulary may come next under a grammar: a bitset over token ids per parser state.
//
// The vocabulary is taken as plain bytes (token id -> its raw bytes), so this knows nothing of the tokenizer.
// VocabularyTrie, built once per vocabulary and shared by every request, stores the tokens as a prefix tree in
// pre-order: one linear pass with subtree skipping visits every token prefix that the grammar allows, advancing
// the automaton one byte per trie node (a memoized table lookup once the state was seen) and skipping the whole
// subtree below a byte the grammar refuses. A token's bytes may cross any number of grammar terminals (`{"a":`)
// and may end inside a UTF-8 character: matching is byte by byte.
//
// TokenMasker (one per request, like the automaton it advances) caches masks, so a state met again (inside a long
// free string, the same point of a repeated array item) costs nothing. A bounded repeat (a string with maxLength,
// maxItems, digit caps) changes the state with every iteration, so masks are cached under mask keys instead
// (GrammarAutomaton::mask_key: the state with canonical repeat counts, which accepts what the state accepts over
// the next `horizon` bytes). A state's exact key canonicalises the counts whose horizon covers the longest token:
// its mask is the state's, and it is what the cache is indexed by. Its coarse key canonicalises every count, with
// a shorter horizon: the exact key's mask is the coarse key's for the tokens within that horizon, plus the longer
// tokens walked from the exact key (a walk that skips every subtree without such a token, and that the state cuts
// short when a bound is near). So inside a `maxLength: 80` string all counts share the coarse key's mask, the
// counts far from 80 walk only their few longest tokens, and the exact keys of the same count in sibling array
// items are the same state.
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "grammar/grammar_matcher.h"
#include "kernels/token_mask_layout.h"

namespace strata::grammar {

using TokenMask = std::vector<uint64_t>;  // the allowed tokens, in kernels/token_mask_layout.h's layout

class VocabularyTrie {
 public:
  // token_bytes[id]: the raw bytes of token id. An empty string (special and control tokens) is never allowed
  // as text; end-of-sequence tokens are allowed through TokenMasker's end list instead.
  explicit VocabularyTrie(const std::vector<std::string>& token_bytes);

  int32_t vocab_size() const { return vocab_size_; }
  size_t node_count() const { return byte_.size(); }

 private:
  friend class TokenMasker;
  void index_lengths();

  int32_t vocab_size_;
  std::vector<std::string> tokens_;
  // Node i (pre-order; 0 is the root): its byte, depth, the end of its subtree, and the tokens that end there
  // (token_ids_[token_begin_[i] .. token_begin_[i + 1])).
  std::vector<uint8_t> byte_;
  std::vector<uint16_t> depth_;
  std::vector<uint32_t> subtree_end_;
  std::vector<uint32_t> token_begin_;
  std::vector<int32_t> token_ids_;
  std::vector<uint16_t> longest_below_;  // by node: the longest token in its subtree
  size_t max_depth_ = 0;
  // Bit sets of the tokens of at most h bytes: no_longer_than_[length_class_[h]], one per distinct token length.
  std::vector<TokenMask> no_longer_than_;
  std::vector<uint32_t> length_class_;
};

class TokenMasker {
 public:
  // end_tokens: the ids that end generation (EOS, <|im_end|>): allowed exactly when the grammar is complete.
  TokenMasker(std::shared_ptr<const VocabularyTrie> vocabulary, std::shared_ptr<GrammarAutomaton> automaton,
              std::vector<int32_t> end_tokens);

  const TokenMask& allowed_tokens(StateId state);  // valid until the next call
  // The state after token `id` (kDeadState when it is not allowed; an end token leaves the state unchanged).
  StateId advance(StateId state, int32_t token);
  bool is_end_token(int32_t token) const;
  GrammarAutomaton& automaton() { return *automaton_; }
  const VocabularyTrie& vocabulary() const { return *vocabulary_; }
  size_t cached_masks() const { return cache_.size(); }
  size_t whole_walks() const { return whole_walks_; }  // masks computed over the whole trie (the costly kind)

  // Then the cache starts afresh. Every constrained choice holds one: 256 masks are 1.5 MiB at 49,152 tokens.
  static constexpr size_t kMaxCachedMasks = 256;

 private:
  StateId exact_key(StateId state);
  const TokenMask& whole_walk_mask(StateId state);
  void walk_longer_than(StateId state, size_t bytes, TokenMask& mask);
  void set_end_tokens(StateId state, TokenMask& mask) const;

  std::shared_ptr<const VocabularyTrie> vocabulary_;
  std::shared_ptr<GrammarAutomaton> automaton_;
  std::vector<int32_t> end_tokens_;
  std::unordered_map<StateId, TokenMask> cache_;  // by key (exact and coarse)
  std::vector<StateId> exact_keys_;               // by state; kDeadState until asked
  size_t whole_walks_ = 0;
  std::vector<StateId> state_at_depth_;
};

// One request's constrained decoding: the current state, its mask, and the tokens accepted.
class TokenMatcher {
 public:
  TokenMatcher(std::shared_ptr<const VocabularyTrie> vocabulary, std::shared_ptr<const Grammar> grammar,
               std::vector<int32_t> end_tokens);

  const TokenMask& allowed_tokens() { return masker_.allowed_tokens(state_); }
  bool accept_token(int32_t token);  // false, and nothing changes, when the token is not allowed
  bool is_complete() const { return masker_.automaton().is_complete(state_); }  // an end token may come now
  bool is_finished() const { return finished_; }                                  // an end token was accepted
  StateId state() const { return state_; }
  TokenMasker& masker() { return masker_; }

 private:
  mutable TokenMasker masker_;
  StateId state_;
  bool finished_ = false;
};

}  // namespace strata::grammar
