#pragma once
// Incremental byte-level matching of a Grammar.
//
// A parse state is a set of stacks (one per way the bytes so far can be read: anyOf branches, optional
// properties, pattern alternatives), each expanded until its top is a byte-consuming node, plus whether some
// reading is already complete. Stack frames are hash-consed (frame = node, position, parent frame), so a stack is
// one integer and equal stacks are the same integer; a state (sorted stack ids + the complete flag) is interned in
// turn, so equal states are the same `StateId`. Transitions state x byte -> state are memoized as they are
// discovered: the automaton becomes, lazily, a DFA over the states actually visited, which is what makes the
// vocabulary walks of token_mask.h cheap (one table lookup per byte after the first time).
//
// Repeat counters above the repeat's minimum are clamped when the repeat is unbounded, so that the state inside a
// long free string or array does not change from one character to the next (the token mask cache then hits).
// A bounded repeat (maxLength, maxItems, digit caps) keeps its count, so its state does change; mask_key()
// gives the token masker a key that is the same for the counts that behave alike over the next bytes.
//
// Not thread-safe: one automaton per request (or per thread). The Grammar it reads is immutable and shared.
#include <array>
#include <cstdint>
#include <memory>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "grammar/grammar.h"

namespace strata::grammar {

using StateId = int32_t;
inline constexpr StateId kDeadState = -1;

class GrammarAutomaton {
 public:
  explicit GrammarAutomaton(std::shared_ptr<const Grammar> grammar);

  StateId initial() const { return initial_; }
  // The state after `byte`, or kDeadState when the byte cannot continue any reading.
  StateId step(StateId state, uint8_t byte) {
    std::array<StateId, 256>& row = transitions(state);
    StateId next = row[byte];
    return next != kUnknown ? next : (row[byte] = compute_step(state, byte));
  }
  bool is_complete(StateId state) const { return states_[state].complete; }
  // Some byte may still follow (false only once the document is complete and nothing can extend it).
  bool can_continue(StateId state) const { return !states_[state].stacks.empty(); }
  // The token masker's key of a state: the state with bounded repeat counts (in every frame of every stack)
  // replaced by their canonical count (the minimum when ending is allowed, else 0), and the horizon: the number of
  // bytes over which the key accepts exactly what the state accepts (kUnbounded: any). Each iteration consumes a
  // byte (GrammarBuilder::finish; Grammar::min_bytes of the child, when more), so from count c only the counts
  // c .. c + k - 1 meet the bounds within (k - 1) * min_bytes + 1 bytes: until then every count >= min passes
  // the same checks (may end, may go on), and so does every count < min (may not end, may go on). A count is
  // replaced only where that holds for min_horizon bytes or more. The complete flag is kept. Frames are
  // independent, so nested repeats are canonicalised alike.
  struct MaskKey {
    StateId state;
    uint32_t horizon;
  };
  MaskKey mask_key(StateId state, uint32_t min_horizon);
  size_t state_count() const { return states_.size(); }
  size_t frame_count() const { return frames_.size(); }
  const Grammar& grammar() const { return *grammar_; }

 private:
  static constexpr StateId kUnknown = -2;
  static constexpr uint32_t kNoFrame = UINT32_MAX;  // the empty stack: the whole grammar matched

  struct Frame {
    uint32_t node, position, parent;
    bool operator==(const Frame&) const = default;
  };
  struct FrameHash {
    size_t operator()(const Frame& f) const {
      return std::hash<uint64_t>()((uint64_t{f.node} << 32 | f.position) * 0x9E3779B97F4A7C15ULL ^ f.parent);
    }
  };
  struct StateKeyHash {
    size_t operator()(const std::vector<uint32_t>& key) const;
  };
  struct State {
    std::vector<uint32_t> stacks;  // sorted frame ids whose node consumes a byte
    bool complete = false;
    std::unique_ptr<std::array<StateId, 256>> next;  // memoized transitions, allocated on first use
  };
  // Stacks reached by one expansion, before they are interned as a state.
  struct Closure {
    std::vector<uint32_t> stacks;
    bool complete = false;
  };

  uint32_t frame(uint32_t node, uint32_t position, uint32_t parent);
  void expand(uint32_t stack, Closure& out, int depth);
  void expand_repeat(const Frame& top, const GrammarNode& node, Closure& out, int depth);
  std::pair<uint32_t, uint32_t> canonical_stack(uint32_t stack, uint32_t min_horizon);  // the stack's key and horizon
  StateId intern(Closure closure);
  StateId compute_step(StateId state, uint8_t byte);
  std::array<StateId, 256>& transitions(StateId state);

  std::shared_ptr<const Grammar> grammar_;
  std::vector<Frame> frames_;
  std::unordered_map<Frame, uint32_t, FrameHash> frame_ids_;
  std::vector<State> states_;
  std::unordered_map<std::vector<uint32_t>, StateId, StateKeyHash> state_ids_;
  StateId initial_ = kDeadState;
};

// A grammar plus a current state: feed bytes, ask whether the text is complete. Copies share the automaton (and
// its memoized transitions), so copying a matcher is copying one integer; copies must stay on one thread.
class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const Grammar> grammar);
  explicit GrammarMatcher(std::shared_ptr<GrammarAutomaton> automaton);

  bool advance(uint8_t byte);            // false, and the state unchanged, when the byte is not allowed
  bool advance(std::string_view bytes);  // all bytes or none
  bool accepts(std::string_view bytes) const;  // would advance(bytes) succeed (the state is not changed)
  bool is_complete() const { return automaton_->is_complete(state_); }
  bool can_continue() const { return automaton_->can_continue(state_); }

  StateId state() const { return state_; }  // equal states compare equal: usable as a hash key
  void set_state(StateId state) { state_ = state; }
  GrammarAutomaton& automaton() const { return *automaton_; }
  const std::shared_ptr<GrammarAutomaton>& shared_automaton() const { return automaton_; }

 private:
  std::shared_ptr<GrammarAutomaton> automaton_;
  StateId state_;
};

}  // namespace strata::grammar
