// The grammar IR's invariants and the byte-level matcher: literals, choices, repeats with bounds, recursion,
// all-or-nothing advances, interned states.
#include "grammar/grammar_matcher.h"

#include <gtest/gtest.h>

#include <memory>
#include <stdexcept>

#include "grammar/grammar.h"

namespace strata::grammar {
namespace {

std::shared_ptr<const Grammar> finish(GrammarBuilder& builder, uint32_t root) {
  return std::make_shared<const Grammar>(std::move(builder).finish(root));
}

bool full_match(const std::shared_ptr<const Grammar>& grammar, std::string_view text) {
  GrammarMatcher matcher(grammar);
  return matcher.advance(text) && matcher.is_complete();
}

TEST(GrammarMatcher, LiteralsAndChoicesSharingPrefixes) {
  GrammarBuilder g;
  uint32_t root = g.choice({g.literal("abc"), g.literal("abd"), g.literal("ab")});
  auto grammar = finish(g, root);
  EXPECT_TRUE(full_match(grammar, "abc"));
  EXPECT_TRUE(full_match(grammar, "abd"));
  EXPECT_TRUE(full_match(grammar, "ab"));
  EXPECT_FALSE(full_match(grammar, "a"));
  EXPECT_FALSE(full_match(grammar, "abe"));
  EXPECT_FALSE(full_match(grammar, "abcd"));
  GrammarMatcher matcher(grammar);
  ASSERT_TRUE(matcher.advance("ab"));
  EXPECT_TRUE(matcher.is_complete());
  EXPECT_TRUE(matcher.can_continue());
  ASSERT_TRUE(matcher.advance("c"));
  EXPECT_TRUE(matcher.is_complete());
  EXPECT_FALSE(matcher.can_continue());
}

TEST(GrammarMatcher, RepeatBounds) {
  GrammarBuilder g;
  uint32_t root = g.sequence({g.literal("<"), g.repeat(g.byte_range('a', 'c'), 2, 4), g.literal(">")});
  auto grammar = finish(g, root);
  EXPECT_FALSE(full_match(grammar, "<a>"));
  EXPECT_TRUE(full_match(grammar, "<ab>"));
  EXPECT_TRUE(full_match(grammar, "<abca>"));
  EXPECT_FALSE(full_match(grammar, "<abcab>"));
  EXPECT_FALSE(full_match(grammar, "<abd>"));
}

TEST(GrammarMatcher, UnboundedRepeatStatesRecur) {
  GrammarBuilder g;
  uint32_t root = g.sequence({g.literal("\""), g.repeat(g.byte_range('a', 'z'), 1, kUnbounded), g.literal("\"")});
  GrammarMatcher matcher(finish(g, root));
  ASSERT_TRUE(matcher.advance("\"ab"));
  StateId after_two = matcher.state();
  ASSERT_TRUE(matcher.advance("cdefgh"));
  EXPECT_EQ(matcher.state(), after_two) << "counts above the minimum are clamped: the state does not grow";
  EXPECT_TRUE(matcher.advance("\""));
  EXPECT_TRUE(matcher.is_complete());
}

TEST(GrammarMatcher, AdvanceIsAllOrNothing) {
  GrammarBuilder g;
  auto grammar = finish(g, g.literal("hello"));
  GrammarMatcher matcher(grammar);
  ASSERT_TRUE(matcher.advance("he"));
  StateId before = matcher.state();
  EXPECT_FALSE(matcher.advance("lx"));
  EXPECT_EQ(matcher.state(), before);
  EXPECT_TRUE(matcher.accepts("llo"));
  EXPECT_EQ(matcher.state(), before);
  EXPECT_FALSE(matcher.advance(uint8_t('x')));
  EXPECT_TRUE(matcher.advance("llo"));
  EXPECT_TRUE(matcher.is_complete());
}

TEST(GrammarMatcher, RecursiveRule) {
  // nested := "[" nested* "]"
  GrammarBuilder g;
  uint32_t nested = g.reserve();
  GrammarNode node;
  node.kind = NodeKind::sequence;
  node.children = {g.literal("["), g.repeat(nested, 0, kUnbounded), g.literal("]")};
  g.define(nested, node);
  auto grammar = finish(g, nested);
  EXPECT_TRUE(full_match(grammar, "[]"));
  EXPECT_TRUE(full_match(grammar, "[[][[]]]"));
  EXPECT_FALSE(full_match(grammar, "[[]"));
  EXPECT_FALSE(full_match(grammar, "[]]"));
}

TEST(GrammarMatcher, EqualStatesAreOneId) {
  GrammarBuilder g;
  uint32_t root = g.choice({g.literal("xa"), g.literal("ya")});
  GrammarMatcher x(finish(g, root));
  GrammarMatcher y = x;  // copies share the automaton
  ASSERT_TRUE(x.advance("xa"));
  ASSERT_TRUE(y.advance("ya"));
  EXPECT_EQ(x.state(), y.state());
}

TEST(GrammarBuilder, RefusesBrokenGrammars) {
  {
    GrammarBuilder g;
    uint32_t root = g.repeat(g.optional(g.literal("a")), 0, kUnbounded);
    EXPECT_THROW(std::move(g).finish(root), std::logic_error) << "a repeat of something nullable";
  }
  {
    GrammarBuilder g;
    uint32_t loop = g.reserve();
    GrammarNode node;
    node.kind = NodeKind::sequence;
    node.children = {loop, g.literal("a")};
    g.define(loop, node);
    EXPECT_THROW(std::move(g).finish(loop), std::logic_error) << "left recursion, and it matches nothing";
  }
  {
    GrammarBuilder g;
    uint32_t loop = g.reserve();
    GrammarNode node;
    node.kind = NodeKind::choice;
    node.children = {g.literal("a"), g.sequence({loop, g.literal("b")})};
    g.define(loop, node);
    EXPECT_THROW(std::move(g).finish(loop), std::logic_error) << "left recursion";
  }
  GrammarBuilder g;
  EXPECT_THROW(g.choice({}), std::logic_error);
  EXPECT_THROW(g.bytes(ByteSet()), std::logic_error);
  EXPECT_THROW(g.repeat(g.literal("a"), 3, 2), std::logic_error);
}

}  // namespace
}  // namespace strata::grammar
