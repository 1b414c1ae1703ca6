#include "grammar/grammar_matcher.h"

#include <algorithm>
#include <stdexcept>

namespace strata::grammar {

namespace {
// Deeper than any closure a compiled schema produces; reaching it means the grammar is broken (a cycle that
// consumes nothing slipped past GrammarBuilder::finish).
constexpr int kMaxClosureDepth = 10000;
}  // namespace

size_t GrammarAutomaton::StateKeyHash::operator()(const std::vector<uint32_t>& key) const {
  uint64_t hash = 0xcbf29ce484222325ULL;
  for (uint32_t value : key) hash = (hash ^ value) * 0x100000001b3ULL;
  return static_cast<size_t>(hash);
}

GrammarAutomaton::GrammarAutomaton(std::shared_ptr<const Grammar> grammar) : grammar_(std::move(grammar)) {
  Closure start;
  expand(frame(grammar_->root(), 0, kNoFrame), start, 0);
  initial_ = intern(std::move(start));
}

uint32_t GrammarAutomaton::frame(uint32_t node, uint32_t position, uint32_t parent) {
  Frame key{node, position, parent};
  auto [it, inserted] = frame_ids_.try_emplace(key, static_cast<uint32_t>(frames_.size()));
  if (inserted) frames_.push_back(key);
  return it->second;
}

// Expands `stack` until its top consumes a byte; every reading lands in `out` (several for a choice).
void GrammarAutomaton::expand(uint32_t stack, Closure& out, int depth) {
  if (depth > kMaxClosureDepth) throw std::logic_error("grammar: closure too deep (a cycle without bytes)");
  if (stack == kNoFrame) {
    out.complete = true;
    return;
  }
  const Frame top = frames_[stack];
  const GrammarNode& node = grammar_->node(top.node);
  switch (node.kind) {
    case NodeKind::bytes:
    case NodeKind::literal: out.stacks.push_back(stack); return;
    case NodeKind::sequence: {
      if (node.children.empty()) return expand(top.parent, out, depth + 1);
      // The last child replaces the sequence's frame (a tail call), so finished sequences never pile up.
      uint32_t rest = top.position + 1 == node.children.size() ? top.parent
                                                               : frame(top.node, top.position + 1, top.parent);
      return expand(frame(node.children[top.position], 0, rest), out, depth + 1);
    }
    case NodeKind::choice:
      for (uint32_t child : node.children) expand(frame(child, 0, top.parent), out, depth + 1);
      return;
    case NodeKind::repeat: return expand_repeat(top, node, out, depth);
  }
}

void GrammarAutomaton::expand_repeat(const Frame& top, const GrammarNode& node, Closure& out, int depth) {
  uint32_t count = top.position;  // iterations begun
  if (count >= node.min_count) expand(top.parent, out, depth + 1);
  if (count >= node.max_count) return;
  uint32_t next = count + 1;
  // Unbounded: every count at or above the minimum behaves alike, so they share one frame.
  if (node.max_count == kUnbounded) next = std::min(next, node.min_count);
  uint32_t rest = next == node.max_count ? top.parent : frame(top.node, next, top.parent);
  expand(frame(node.children[0], 0, rest), out, depth + 1);
}

namespace {

uint32_t saturated(uint64_t value) { return static_cast<uint32_t>(std::min<uint64_t>(value, kUnbounded)); }

struct CanonicalCount {
  uint32_t count, horizon;
};

// A repeat count's canonical count, and for how many bytes it passes the same bound checks as `count`; the count
// itself when that is fewer than min_horizon bytes. The iteration under way ends after a byte at the earliest and
// each further one takes child_bytes or more, so within h bytes only the counts count .. count + (h - 1) /
// child_bytes meet the bounds.
CanonicalCount canonical_count(const GrammarNode& repeat, uint32_t child_bytes, uint32_t count, uint32_t min_horizon) {
  const uint64_t spacing = std::max(child_bytes, 1u);
  CanonicalCount canonical{count, kUnbounded};
  if (count >= repeat.min_count) {  // may end; may go on until the maximum is near
    if (count != repeat.min_count && repeat.max_count != kUnbounded) {
      canonical = {repeat.min_count, saturated((repeat.max_count - count) * spacing)};
    }
  } else if (count != 0) {  // may not end yet, may go on
    canonical = {0, saturated((repeat.min_count - count) * spacing)};
  }
  return canonical.horizon >= min_horizon ? canonical : CanonicalCount{count, kUnbounded};
}

}  // namespace

GrammarAutomaton::MaskKey GrammarAutomaton::mask_key(StateId state, uint32_t min_horizon) {
  Closure key;
  key.complete = states_[state].complete;
  uint32_t horizon = kUnbounded;
  for (uint32_t stack : states_[state].stacks) {
    auto [canonical, stack_horizon] = canonical_stack(stack, min_horizon);
    key.stacks.push_back(canonical);
    horizon = std::min(horizon, stack_horizon);
  }
  return {intern(std::move(key)), horizon};
}

// Rebuilds the stack bottom-up: frames below the first changed count are kept, the ones above get new parents.
std::pair<uint32_t, uint32_t> GrammarAutomaton::canonical_stack(uint32_t stack, uint32_t min_horizon) {
  std::vector<uint32_t> chain;  // the stack's frames, top first
  for (uint32_t id = stack; id != kNoFrame; id = frames_[id].parent) chain.push_back(id);
  uint32_t rebuilt = kNoFrame, horizon = kUnbounded;
  bool changed = false;
  for (auto id = chain.rbegin(); id != chain.rend(); ++id) {
    const Frame old = frames_[*id];
    const GrammarNode& node = grammar_->node(old.node);
    CanonicalCount position{old.position, kUnbounded};
    if (node.kind == NodeKind::repeat) {
      position = canonical_count(node, grammar_->min_bytes(node.children[0]), old.position, min_horizon);
    }
    changed |= position.count != old.position;
    rebuilt = changed ? frame(old.node, position.count, rebuilt) : *id;
    horizon = std::min(horizon, position.horizon);
  }
  return {rebuilt, horizon};
}

StateId GrammarAutomaton::intern(Closure closure) {
  std::vector<uint32_t>& key = closure.stacks;
  std::sort(key.begin(), key.end());
  key.erase(std::unique(key.begin(), key.end()), key.end());
  if (closure.complete) key.push_back(kNoFrame);  // the complete flag is part of the key
  auto found = state_ids_.find(key);
  if (found != state_ids_.end()) return found->second;
  StateId id = static_cast<StateId>(states_.size());
  state_ids_.emplace(key, id);
  if (closure.complete) key.pop_back();
  states_.push_back(State{std::move(key), closure.complete, nullptr});
  return id;
}

StateId GrammarAutomaton::compute_step(StateId state, uint8_t byte) {
  Closure out;
  const std::vector<uint32_t> stacks = states_[state].stacks;  // a copy: interning below may move states_
  for (uint32_t stack : stacks) {
    const Frame top = frames_[stack];
    const GrammarNode& node = grammar_->node(top.node);
    if (node.kind == NodeKind::bytes) {
      if (node.bytes.has(byte)) expand(top.parent, out, 0);
    } else if (static_cast<uint8_t>(node.text[top.position]) == byte) {  // literal
      if (top.position + 1 < node.text.size()) {
        out.stacks.push_back(frame(top.node, top.position + 1, top.parent));
      } else {
        expand(top.parent, out, 0);
      }
    }
  }
  if (out.stacks.empty() && !out.complete) return kDeadState;
  return intern(std::move(out));
}

std::array<StateId, 256>& GrammarAutomaton::transitions(StateId state) {
  std::unique_ptr<std::array<StateId, 256>>& next = states_[state].next;
  if (!next) {
    next = std::make_unique<std::array<StateId, 256>>();
    next->fill(kUnknown);
  }
  return *next;
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> grammar)
    : GrammarMatcher(std::make_shared<GrammarAutomaton>(std::move(grammar))) {}

GrammarMatcher::GrammarMatcher(std::shared_ptr<GrammarAutomaton> automaton)
    : automaton_(std::move(automaton)), state_(automaton_->initial()) {}

bool GrammarMatcher::advance(uint8_t byte) {
  StateId next = automaton_->step(state_, byte);
  if (next == kDeadState) return false;
  state_ = next;
  return true;
}

bool GrammarMatcher::advance(std::string_view bytes) {
  StateId state = state_;
  for (char byte : bytes) {
    state = automaton_->step(state, static_cast<uint8_t>(byte));
    if (state == kDeadState) return false;
  }
  state_ = state;
  return true;
}

bool GrammarMatcher::accepts(std::string_view bytes) const {
  GrammarMatcher copy = *this;
  return copy.advance(bytes);
}

}  // namespace strata::grammar
