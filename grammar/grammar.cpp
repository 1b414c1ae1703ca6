#include "grammar/grammar.h"

#include <algorithm>
#include <stdexcept>

namespace strata::grammar {

ByteSet ByteSet::single(uint8_t byte) {
  ByteSet set;
  set.add(byte);
  return set;
}

ByteSet ByteSet::range(uint8_t first, uint8_t last) {
  ByteSet set;
  set.add_range(first, last);
  return set;
}

void ByteSet::add_range(uint8_t first, uint8_t last) {
  for (unsigned byte = first; byte <= last; ++byte) add(static_cast<uint8_t>(byte));
}

namespace {

uint32_t saturated(uint64_t bytes) { return static_cast<uint32_t>(std::min<uint64_t>(bytes, kUnbounded)); }

// A node's fewest bytes given its children's current values.
uint32_t node_min_bytes(const GrammarNode& node, const std::vector<uint32_t>& min_bytes) {
  switch (node.kind) {
    case NodeKind::bytes: return 1;
    case NodeKind::literal: return static_cast<uint32_t>(node.text.size());
    case NodeKind::repeat:
      return node.min_count == 0 ? 0 : saturated(uint64_t{node.min_count} * min_bytes[node.children[0]]);
    case NodeKind::choice: {
      uint32_t fewest = kUnbounded;
      for (uint32_t child : node.children) fewest = std::min(fewest, min_bytes[child]);
      return fewest;
    }
    case NodeKind::sequence: {
      uint64_t total = 0;
      for (uint32_t child : node.children) total += min_bytes[child];
      return saturated(total);
    }
  }
  return kUnbounded;
}

// Shortest matches over a possibly recursive graph: values only fall from "none" until nothing changes (children
// mostly come before their parents, so few passes are needed).
std::vector<uint32_t> shortest_matches(const std::vector<GrammarNode>& nodes) {
  std::vector<uint32_t> min_bytes(nodes.size(), kUnbounded);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t id = 0; id < nodes.size(); ++id) {
      const uint32_t fewest = node_min_bytes(nodes[id], min_bytes);
      if (fewest < min_bytes[id]) min_bytes[id] = fewest, changed = true;
    }
  }
  return min_bytes;
}

}  // namespace

Grammar::Grammar(std::vector<GrammarNode> nodes, uint32_t root)
    : nodes_(std::move(nodes)), root_(root), min_bytes_(shortest_matches(nodes_)) {}

uint32_t GrammarBuilder::add(GrammarNode node) {
  nodes_.push_back(std::move(node));
  reserved_.push_back(false);
  return static_cast<uint32_t>(nodes_.size() - 1);
}

uint32_t GrammarBuilder::bytes(ByteSet set) {
  if (set.empty()) throw std::logic_error("grammar: a byte set without bytes");
  GrammarNode node;
  node.kind = NodeKind::bytes;
  node.bytes = set;
  return add(std::move(node));
}

uint32_t GrammarBuilder::literal(std::string_view text) {
  if (text.empty()) return empty();
  if (text.size() == 1) return bytes(ByteSet::single(static_cast<uint8_t>(text[0])));
  GrammarNode node;
  node.kind = NodeKind::literal;
  node.text = std::string(text);
  return add(std::move(node));
}

uint32_t GrammarBuilder::empty() { return add(GrammarNode{}); }

uint32_t GrammarBuilder::sequence(std::vector<uint32_t> children) {
  if (children.size() == 1) return children[0];
  GrammarNode node;
  node.kind = NodeKind::sequence;
  node.children = std::move(children);
  return add(std::move(node));
}

uint32_t GrammarBuilder::choice(std::vector<uint32_t> children) {
  if (children.empty()) throw std::logic_error("grammar: a choice without alternatives");
  if (children.size() == 1) return children[0];
  GrammarNode node;
  node.kind = NodeKind::choice;
  node.children = std::move(children);
  return add(std::move(node));
}

uint32_t GrammarBuilder::repeat(uint32_t child, uint32_t min_count, uint32_t max_count) {
  if (min_count > max_count) throw std::logic_error("grammar: a repeat with min > max");
  if (max_count == 0) return empty();
  if (min_count == 1 && max_count == 1) return child;
  GrammarNode node;
  node.kind = NodeKind::repeat;
  node.children = {child};
  node.min_count = min_count;
  node.max_count = max_count;
  return add(std::move(node));
}

uint32_t GrammarBuilder::reserve() {
  uint32_t id = add(GrammarNode{});
  reserved_[id] = true;
  return id;
}

void GrammarBuilder::define(uint32_t id, GrammarNode node) {
  if (!reserved_.at(id)) throw std::logic_error("grammar: define() of a node that was not reserved");
  nodes_[id] = std::move(node);
  reserved_[id] = false;
}

bool GrammarBuilder::nullable(uint32_t id) const {
  const GrammarNode& node = nodes_[id];
  switch (node.kind) {
    case NodeKind::bytes:
    case NodeKind::literal: return false;
    case NodeKind::repeat: return node.min_count == 0 || nullable(node.children[0]);
    case NodeKind::choice:
      for (uint32_t child : node.children) {
        if (nullable(child)) return true;
      }
      return false;
    case NodeKind::sequence:
      for (uint32_t child : node.children) {
        if (!nullable(child)) return false;
      }
      return true;
  }
  return false;
}

namespace {

// Least fixpoint of "matches the empty string" and of "matches some string", over a possibly cyclic graph.
struct NodeFacts {
  std::vector<bool> nullable, productive;
};

bool node_fact(const GrammarNode& node, const std::vector<bool>& fact, bool nullable_fact) {
  switch (node.kind) {
    case NodeKind::bytes:
    case NodeKind::literal: return !nullable_fact;
    case NodeKind::repeat: return node.min_count == 0 || fact[node.children[0]];
    case NodeKind::choice:
      for (uint32_t child : node.children) {
        if (fact[child]) return true;
      }
      return false;
    case NodeKind::sequence:
      for (uint32_t child : node.children) {
        if (!fact[child]) return false;
      }
      return true;
  }
  return false;
}

std::vector<bool> fixpoint(const std::vector<GrammarNode>& nodes, bool nullable_fact) {
  std::vector<bool> fact(nodes.size(), false);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t id = 0; id < nodes.size(); ++id) {
      if (!fact[id] && node_fact(nodes[id], fact, nullable_fact)) fact[id] = changed = true;
    }
  }
  return fact;
}

// The nodes a node may start with before consuming a byte: a cycle among them is left recursion.
std::vector<uint32_t> leading_children(const GrammarNode& node, const std::vector<bool>& nullable) {
  if (node.kind == NodeKind::sequence) {
    std::vector<uint32_t> leading;
    for (uint32_t child : node.children) {
      leading.push_back(child);
      if (!nullable[child]) break;
    }
    return leading;
  }
  if (node.kind == NodeKind::choice || node.kind == NodeKind::repeat) return node.children;
  return {};
}

bool has_left_recursion(const std::vector<GrammarNode>& nodes, const std::vector<bool>& nullable) {
  enum Mark : uint8_t { unseen, open, done };
  std::vector<Mark> mark(nodes.size(), unseen);
  for (uint32_t start = 0; start < nodes.size(); ++start) {
    if (mark[start] != unseen) continue;
    std::vector<std::pair<uint32_t, size_t>> path{{start, 0}};  // iterative DFS: node, next leading child
    mark[start] = open;
    while (!path.empty()) {
      auto& [id, next] = path.back();
      std::vector<uint32_t> leading = leading_children(nodes[id], nullable);
      if (next == leading.size()) {
        mark[id] = done;
        path.pop_back();
        continue;
      }
      uint32_t child = leading[next++];
      if (mark[child] == open) return true;
      if (mark[child] == unseen) {
        mark[child] = open;
        path.emplace_back(child, 0);
      }
    }
  }
  return false;
}

}  // namespace

Grammar GrammarBuilder::finish(uint32_t root) && {
  for (size_t id = 0; id < nodes_.size(); ++id) {
    if (reserved_[id]) throw std::logic_error("grammar: a reserved node was never defined");
  }
  std::vector<bool> nullable_nodes = fixpoint(nodes_, true);
  std::vector<bool> productive = fixpoint(nodes_, false);
  for (size_t id = 0; id < nodes_.size(); ++id) {
    if (!productive[id]) throw std::logic_error("grammar: node " + std::to_string(id) + " matches nothing");
    const GrammarNode& node = nodes_[id];
    if (node.kind == NodeKind::repeat && nullable_nodes[node.children[0]]) {
      throw std::logic_error("grammar: node " + std::to_string(id) + " repeats something that can be empty");
    }
  }
  if (has_left_recursion(nodes_, nullable_nodes)) throw std::logic_error("grammar: left recursion");
  return Grammar(std::move(nodes_), root);
}

std::shared_ptr<const Grammar> surround(const Grammar& grammar, std::string_view prefix, std::string_view suffix) {
  GrammarBuilder builder;
  for (uint32_t id = 0; id < grammar.size(); ++id) builder.define(builder.reserve(), grammar.node(id));
  std::vector<uint32_t> parts;
  if (!prefix.empty()) parts.push_back(builder.literal(prefix));
  parts.push_back(grammar.root());
  if (!suffix.empty()) parts.push_back(builder.literal(suffix));
  const uint32_t root = builder.sequence(std::move(parts));
  return std::make_shared<const Grammar>(std::move(builder).finish(root));
}

}  // namespace strata::grammar
