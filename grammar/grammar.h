#pragma once
// The grammar IR that JSON Schemas compile to: a graph of nodes over bytes (byte sets, literals, sequences,
// choices and repeats with bounds). Nodes refer to each other by index, so a rule may be recursive (any JSON value
// contains values); nothing else is needed: no named rules, no lookahead.
//
// Why this IR rather than an automaton per schema node: every construct we compile (nested objects, anyOf,
// number ranges, regex patterns, UTF-8 character classes) is a sequence/choice/repeat over byte sets, so one small
// interpreter (grammar_matcher.h) serves them all, and nondeterminism (anyOf, optional properties, patterns)
// is handled once, by tracking a set of stacks.
//
// Invariants checked by GrammarBuilder::finish(), which the matcher relies on to never reach a dead end:
//   - every node is productive (its language is not empty), so any stack the matcher keeps can still complete;
//   - no repeat has a child that matches the empty string (the matcher's closure would loop);
//   - no recursion reaches a node again without consuming a byte (left recursion).
#include <array>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace strata::grammar {

// 256 bits: which bytes a `bytes` node accepts.
class ByteSet {
 public:
  ByteSet() = default;
  static ByteSet single(uint8_t byte);
  static ByteSet range(uint8_t first, uint8_t last);  // inclusive
  void add(uint8_t byte) { words_[byte >> 6] |= uint64_t{1} << (byte & 63); }
  void add_range(uint8_t first, uint8_t last);
  bool has(uint8_t byte) const { return (words_[byte >> 6] >> (byte & 63)) & 1; }
  bool empty() const { return (words_[0] | words_[1] | words_[2] | words_[3]) == 0; }
  bool operator==(const ByteSet&) const = default;

 private:
  std::array<uint64_t, 4> words_{};
};

enum class NodeKind : uint8_t {
  bytes,     // one byte out of `bytes`
  literal,   // exactly `text`
  sequence,  // children one after another (none: the empty string)
  choice,    // one of the children
  repeat,    // child repeated between min_count and max_count times
};

inline constexpr uint32_t kUnbounded = std::numeric_limits<uint32_t>::max();

struct GrammarNode {
  NodeKind kind = NodeKind::sequence;
  ByteSet bytes;                   // bytes
  std::string text;                // literal (never empty: an empty literal is built as an empty sequence)
  std::vector<uint32_t> children;  // sequence, choice; repeat: exactly one
  uint32_t min_count = 0;          // repeat
  uint32_t max_count = 0;          // repeat: kUnbounded for no bound
};

class Grammar {
 public:
  Grammar(std::vector<GrammarNode> nodes, uint32_t root);
  const GrammarNode& node(uint32_t id) const { return nodes_[id]; }
  uint32_t root() const { return root_; }
  size_t size() const { return nodes_.size(); }
  // The fewest bytes that node `id` matches (kUnbounded when it matches nothing): how far apart a repeat's
  // iterations are at least (GrammarAutomaton::mask_key).
  uint32_t min_bytes(uint32_t id) const { return min_bytes_[id]; }

 private:
  std::vector<GrammarNode> nodes_;
  uint32_t root_;
  std::vector<uint32_t> min_bytes_;
};

// Builds a Grammar node by node. `reserve()` + `define()` make recursive rules. The helpers fold trivial cases
// (a one-child sequence or choice is its child) so that compiled grammars stay small.
class GrammarBuilder {
 public:
  uint32_t bytes(ByteSet set);
  uint32_t byte_range(uint8_t first, uint8_t last) { return bytes(ByteSet::range(first, last)); }
  uint32_t literal(std::string_view text);
  uint32_t empty();
  uint32_t sequence(std::vector<uint32_t> children);
  uint32_t choice(std::vector<uint32_t> children);
  uint32_t repeat(uint32_t child, uint32_t min_count, uint32_t max_count);
  uint32_t optional(uint32_t child) { return repeat(child, 0, 1); }

  uint32_t reserve();                              // a node to be defined later (for recursion)
  void define(uint32_t id, GrammarNode node);      // fills a reserved node
  const GrammarNode& node(uint32_t id) const { return nodes_[id]; }
  bool nullable(uint32_t id) const;                // matches the empty string (nodes without recursion only)

  // Checks the invariants above (std::logic_error: a bug of the compiler, not of the user's schema).
  Grammar finish(uint32_t root) &&;

 private:
  uint32_t add(GrammarNode node);
  std::vector<GrammarNode> nodes_;
  std::vector<bool> reserved_;
};

// `grammar` between two literal texts (a forced tool call's "<tool_call>\n" and "\n</tool_call>"); an empty
// text is left out.
std::shared_ptr<const Grammar> surround(const Grammar& grammar, std::string_view prefix, std::string_view suffix);

}  // namespace strata::grammar
